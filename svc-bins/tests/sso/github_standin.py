"""A stand-in for GitHub's OAuth and REST endpoints (a real GitHub cannot be reached from the
test), answering with GitHub's documented shapes and checking the requests against them.

Usage: github_standin.py PORT CLIENT_ID CLIENT_SECRET REDIRECT_URI LOGIN ORG TEAM

  GET  /login/oauth/authorize?client_id&redirect_uri&scope&state
       -> 302 to REDIRECT_URI?code=...&state=... (the user LOGIN approves at once)
  POST /login/oauth/access_token (form: client_id, client_secret, code[, redirect_uri];
       Accept: application/json) -> {"access_token", "token_type": "bearer", "scope"}
  GET  /api/v3/user        (Authorization: Bearer/token <access_token>) -> {"login", "id", ...}
  GET  /api/v3/user/teams  (same; per_page/page) -> [{"slug", "name", "organization": {"login"}}]

A request that breaks a rule gets GitHub's error shape and is written to stderr as
"standin: refused: ..."; the test fails on any such line. Prints "ready PORT" when listening.
"""

import json
import secrets
import sys
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from urllib.parse import parse_qs, urlencode, urlsplit

PORT, CLIENT_ID, CLIENT_SECRET, REDIRECT_URI, LOGIN, ORG, TEAM = sys.argv[1:8]
codes = {}
tokens = {}


class Handler(BaseHTTPRequestHandler):
    def log_message(self, fmt, *args):
        sys.stderr.write("standin: " + fmt % args + "\n")

    def answer(self, status, value, headers=()):
        body = json.dumps(value).encode()
        self.send_response(status)
        self.send_header("Content-Type", "application/json; charset=utf-8")
        for k, v in headers:
            self.send_header(k, v)
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def refuse(self, status, why):
        sys.stderr.write(f"standin: refused: {why}\n")
        sys.stderr.flush()
        self.answer(status, {"message": why, "documentation_url": "https://docs.github.com/rest"})

    def do_GET(self):
        url = urlsplit(self.path)
        q = {k: v[0] for k, v in parse_qs(url.query).items()}
        if url.path == "/login/oauth/authorize":
            if q.get("client_id") != CLIENT_ID:
                return self.refuse(400, "authorize: unknown client_id")
            if q.get("redirect_uri") != REDIRECT_URI:
                return self.refuse(400, "authorize: redirect_uri does not match the application's")
            if "read:org" not in q.get("scope", "").split():
                return self.refuse(400, "authorize: the teams API needs the read:org scope")
            if not q.get("state"):
                return self.refuse(400, "authorize: no state")
            code = secrets.token_hex(10)
            codes[code] = LOGIN
            self.send_response(302)
            self.send_header("Location", REDIRECT_URI + "?" + urlencode({"code": code, "state": q["state"]}))
            self.send_header("Content-Length", "0")
            self.end_headers()
            return
        if url.path in ("/api/v3/user", "/api/v3/user/teams"):
            accept = self.headers.get("Accept", "")
            if "application/vnd.github+json" not in accept and "application/json" not in accept:
                return self.refuse(415, f"api: Accept must be application/vnd.github+json, got {accept!r}")
            auth = self.headers.get("Authorization", "")
            scheme, _, token = auth.partition(" ")
            if scheme.lower() not in ("bearer", "token") or token not in tokens:
                return self.refuse(401, "api: Bad credentials")
            login = tokens[token]
            if url.path == "/api/v3/user":
                return self.answer(200, {"login": login, "id": 1, "type": "User", "name": login.title()})
            page = int(q.get("page", "1"))
            teams = [{"id": 7, "slug": TEAM, "name": TEAM.upper(), "organization": {"login": ORG, "id": 9}},
                     {"id": 8, "slug": "readers", "name": "Readers", "organization": {"login": "other-org", "id": 10}}]
            return self.answer(200, teams if page == 1 else [])
        self.refuse(404, f"Not Found: {url.path}")

    def do_POST(self):
        url = urlsplit(self.path)
        n = int(self.headers.get("Content-Length") or 0)
        form = {k: v[0] for k, v in parse_qs(self.rfile.read(n).decode()).items()}
        if url.path == "/login/oauth/access_token":
            if "application/json" not in self.headers.get("Accept", ""):
                return self.refuse(406, "access_token: without Accept: application/json GitHub answers form-encoded")
            if form.get("client_id") != CLIENT_ID or form.get("client_secret") != CLIENT_SECRET:
                return self.answer(200, {"error": "incorrect_client_credentials",
                                         "error_description": "The client_id and/or client_secret passed are incorrect."})
            login = codes.pop(form.get("code", ""), None)
            if login is None:
                return self.answer(200, {"error": "bad_verification_code",
                                         "error_description": "The code passed is incorrect or expired."})
            if "redirect_uri" in form and form["redirect_uri"] != REDIRECT_URI:
                return self.answer(200, {"error": "redirect_uri_mismatch",
                                         "error_description": "The redirect_uri MUST match the registered callback URL."})
            token = "gho_" + secrets.token_hex(16)
            tokens[token] = login
            return self.answer(200, {"access_token": token, "token_type": "bearer", "scope": "read:org"})
        self.refuse(404, f"Not Found: {url.path}")


server = ThreadingHTTPServer(("127.0.0.1", int(PORT)), Handler)
print(f"ready {PORT}", flush=True)
server.serve_forever()
