"""A real OpenID Provider for svc's single sign-on test, built on pyoidc (`oic`).

Usage: oidc_op.py PORT CLIENT_ID CLIENT_SECRET REDIRECT_URI

Serves on 127.0.0.1:PORT (plain HTTP, loopback only) the provider's discovery document,
authorization (with a login form: alice/ops, bob/nobody), token and userinfo endpoints from
pyoidc's Provider, and the key set at /jwks. PKCE (S256) is enforced here: pyoidc's OpenID
provider does not check it. Test controls (loopback only): POST /control/rotate replaces the
signing key with a new one (new kid, old key unpublished); POST /control/rogue signs the next
ID tokens with a key that is never published; POST /control/normal undoes rogue.
Prints "ready <port>" on stdout once listening.
"""

import base64
import hashlib
import html
import json
import sys
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from urllib.parse import parse_qs, urlencode, urlsplit

from Cryptodome.PublicKey import RSA
from jwkest.jwk import RSAKey
from oic.oic.provider import Provider
from oic.utils.authn.authn_context import AuthnBroker
from oic.utils.authn.client import verify_client
from oic.utils.authn.user import UsernamePasswordMako
from oic.utils.authz import AuthzHandling
from oic.utils.http_util import Redirect, Response, SeeOther
from oic.utils.keyio import KeyBundle, KeyJar
from oic.utils.sdb import create_session_db
from oic.utils.userinfo import UserInfo

PORT, CLIENT_ID, CLIENT_SECRET, REDIRECT_URI = sys.argv[1:5]
ISSUER = f"http://127.0.0.1:{PORT}"

PASSWORDS = {"alice": "alice-pass", "bob": "bob-pass"}
USERS = {
    "alice": {"sub": "alice", "email": "alice@example.com", "preferred_username": "alice",
              "name": "Alice", "groups": ["dev", "ops"]},
    "bob": {"sub": "bob", "email": "bob@example.com", "preferred_username": "bob",
            "name": "Bob", "groups": ["nobody"]},
}


class FormAuthn(UsernamePasswordMako):
    """pyoidc's username/password method with a plain HTML form instead of a Mako template."""

    def __call__(self, cookie=None, end_point_index=0, **kwargs):
        query = html.escape(kwargs.get("query", ""), quote=True)
        page = (
            "<html><body><form method='post' action='/verify'>"
            f"<input type='hidden' name='query' value='{query}'>"
            "<input name='login'><input name='password' type='password'>"
            "<input type='submit' value='Sign in'></form></body></html>"
        )
        return Response(page)


KEY_COUNTER = [0]


def new_bundle(prefix):
    KEY_COUNTER[0] += 1
    key = RSAKey(key=RSA.generate(2048), kid=f"{prefix}-{KEY_COUNTER[0]}", use="sig")
    kb = KeyBundle(keytype="RSA", keyusage=["sig"])
    kb.append(key)
    return kb


published = new_bundle("op")
rogue = new_bundle("rogue")
keyjar = KeyJar()
keyjar.add_kb("", published)

broker = AuthnBroker()
authn = FormAuthn(None, None, None, PASSWORDS, "/authorization")
broker.add("UNDEFINED", authn)
cdb = {
    CLIENT_ID: {
        "client_id": CLIENT_ID,
        "client_secret": CLIENT_SECRET,
        "redirect_uris": [(REDIRECT_URI, None)],
        "token_endpoint_auth_method": "client_secret_basic",
        "response_types": ["code"],
        "client_salt": "salt",
    }
}
provider = Provider(
    ISSUER,
    create_session_db(ISSUER, "secret", "password"),
    cdb,
    broker,
    UserInfo(USERS),
    AuthzHandling(),
    verify_client,
    "symmetric-key-0123456789abcdef",
    keyjar=keyjar,
    baseurl=ISSUER,
    extra_scope_dict={"groups": ["groups"]},
)
provider.jwks_uri = f"{ISSUER}/jwks"
authn.srv = provider

# PKCE: code_challenge per authorization request, then per issued code.
challenges_by_query = {}
challenges_by_code = {}


def b64url_sha256(verifier):
    return base64.urlsafe_b64encode(hashlib.sha256(verifier.encode()).digest()).rstrip(b"=").decode()


class Handler(BaseHTTPRequestHandler):
    def log_message(self, fmt, *args):
        sys.stderr.write("op: " + fmt % args + "\n")

    def send(self, resp):
        status = int(resp.status_code)
        headers = list(resp.headers)
        if isinstance(resp, (Redirect, SeeOther)):
            # pyoidc's redirects carry the target as their message.
            headers.append(("Location", resp.message))
            body = b""
        else:
            body = resp.message if isinstance(resp.message, (bytes, str)) else json.dumps(resp.message)
        if isinstance(body, str):
            body = body.encode()
        self.send_response(status)
        has_type = False
        for name, value in headers:
            has_type |= name.lower() == "content-type"
            self.send_header(name, value)
        if not has_type:
            self.send_header("Content-Type", "text/html")
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def raw(self, status, body, ctype="application/json"):
        body = body.encode() if isinstance(body, str) else body
        self.send_response(status)
        self.send_header("Content-Type", ctype)
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def body(self):
        n = int(self.headers.get("Content-Length") or 0)
        return self.rfile.read(n).decode()

    def do_GET(self):
        url = urlsplit(self.path)
        if url.path == "/.well-known/openid-configuration":
            return self.send(provider.providerinfo_endpoint())
        if url.path == "/jwks":
            return self.raw(200, json.dumps({"keys": published.jwks() and json.loads(published.jwks())["keys"]}))
        if url.path == "/authorization":
            q = parse_qs(url.query)
            if "code_challenge" in q:
                if q.get("code_challenge_method") != ["S256"]:
                    return self.raw(400, '{"error":"invalid_request","error_description":"PKCE S256 required"}')
                challenges_by_query[q["state"][0]] = q["code_challenge"][0]
            resp = provider.authorization_endpoint(request=url.query, cookie=self.headers.get("Cookie"))
            self.remember_code(resp)
            return self.send(resp)
        if url.path == "/userinfo":
            return self.send(provider.userinfo_endpoint(request=url.query, authn=self.headers.get("Authorization", "")))
        self.raw(404, '{"error":"not found"}')

    def remember_code(self, resp):
        if isinstance(resp, (Redirect, SeeOther)):
            q = parse_qs(urlsplit(resp.message).query)
            if "code" in q and "state" in q and q["state"][0] in challenges_by_query:
                challenges_by_code[q["code"][0]] = challenges_by_query.pop(q["state"][0])

    def do_POST(self):
        url = urlsplit(self.path)
        body = self.body()
        if url.path == "/verify":
            resp, _ok = authn.verify(body, cookie=self.headers.get("Cookie"), return_to="/authorization")
            return self.send(resp)
        if url.path == "/token":
            q = parse_qs(body)
            code = q.get("code", [""])[0]
            challenge = challenges_by_code.pop(code, None)
            verifier = q.get("code_verifier", [""])[0]
            if challenge is None or b64url_sha256(verifier) != challenge:
                return self.raw(400, '{"error":"invalid_grant","error_description":"PKCE verification failed"}')
            if self.headers.get("Accept", "").find("json") < 0:
                return self.raw(400, '{"error":"invalid_request","error_description":"Accept: application/json expected"}')
            return self.send(provider.token_endpoint(request=body, authn=self.headers.get("Authorization", "")))
        if url.path == "/userinfo":
            return self.send(provider.userinfo_endpoint(request=body, authn=self.headers.get("Authorization", "")))
        if url.path == "/control/rotate":
            global published
            published = new_bundle("op")
            keyjar.issuer_keys[""] = [published]
            return self.raw(200, json.dumps({"kid": published.kids()}))
        if url.path == "/control/rogue":
            keyjar.issuer_keys[""] = [rogue]
            return self.raw(200, "{}")
        if url.path == "/control/normal":
            keyjar.issuer_keys[""] = [published]
            return self.raw(200, "{}")
        self.raw(404, '{"error":"not found"}')


server = ThreadingHTTPServer(("127.0.0.1", int(PORT)), Handler)
print(f"ready {PORT}", flush=True)
server.serve_forever()
