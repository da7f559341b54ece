"""A SAML 2.0 identity provider for svc's tests, built on pysaml2 (signing with xmlsec1).

Each call is one step of what a real IdP does, driven by the test through JSON on stdin;
the answer is JSON on stdout. Commands:

  keygen DIR      an RSA key and a self-signed certificate: DIR/key.pem, DIR/cert.pem
  metadata        {"idp": IDP} -> {"xml": the IdP's metadata}
  respond         {"idp": IDP, "sp_metadata": XML, "saml_request": the HTTP-Redirect
                   SAMLRequest value, "user": NAME, "attributes": {NAME: [VALUES]},
                   "sign": "assertion" | "response" | "both" | "none",
                   optional "audience", "destination", "issuer", "lifetime_minutes"}
                  -> {"saml_response": base64 of the signed Response, "in_response_to": ID,
                      "acs": the ACS URL taken from the SP's metadata}

IDP is {"entity_id", "sso_url", "key_file", "cert_file"}. The request is parsed exactly as
an IdP parses it (inflate, base64, schema); the SP's metadata gives the ACS URL; the
assertion's lifetime (its NotOnOrAfter and the SubjectConfirmationData's) comes from the IdP
policy, so a negative "lifetime_minutes" issues an assertion that has already expired.
"""

import datetime
import json
import os
import sys

from saml2 import BINDING_HTTP_POST, BINDING_HTTP_REDIRECT
from saml2.config import IdPConfig
from saml2.metadata import create_metadata_string
from saml2.saml import NAMEID_FORMAT_PERSISTENT, NameID
from saml2.server import Server
from saml2.xmldsig import DIGEST_SHA256, SIG_RSA_SHA256


def fail(message):
    sys.stderr.write("saml_idp.py: " + message + "\n")
    sys.exit(2)


def keygen(directory):
    from cryptography import x509
    from cryptography.hazmat.primitives import hashes, serialization
    from cryptography.hazmat.primitives.asymmetric import rsa
    from cryptography.x509.oid import NameOID

    key = rsa.generate_private_key(public_exponent=65537, key_size=2048)
    name = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, "svc test IdP")])
    now = datetime.datetime.now(datetime.timezone.utc)
    cert = (
        x509.CertificateBuilder()
        .subject_name(name)
        .issuer_name(name)
        .public_key(key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(now - datetime.timedelta(days=1))
        .not_valid_after(now + datetime.timedelta(days=30))
        .sign(key, hashes.SHA256())
    )
    os.makedirs(directory, exist_ok=True)
    with open(os.path.join(directory, "key.pem"), "wb") as f:
        f.write(
            key.private_bytes(
                serialization.Encoding.PEM,
                serialization.PrivateFormat.TraditionalOpenSSL,
                serialization.NoEncryption(),
            )
        )
    with open(os.path.join(directory, "cert.pem"), "wb") as f:
        f.write(cert.public_bytes(serialization.Encoding.PEM))
    return {"key_file": os.path.join(directory, "key.pem"), "cert_file": os.path.join(directory, "cert.pem")}


def server(idp, sp_metadata=None, lifetime_minutes=5):
    conf = {
        "entityid": idp["entity_id"],
        "xmlsec_binary": "/usr/bin/xmlsec1",
        "key_file": idp["key_file"],
        "cert_file": idp["cert_file"],
        "service": {
            "idp": {
                "endpoints": {"single_sign_on_service": [(idp["sso_url"], BINDING_HTTP_REDIRECT)]},
                "name_id_format": [NAMEID_FORMAT_PERSISTENT],
                "want_authn_requests_signed": False,
                "policy": {
                    "default": {
                        "lifetime": {"minutes": lifetime_minutes},
                        "attribute_restrictions": None,
                        "name_form": "urn:oasis:names:tc:SAML:2.0:attrname-format:basic",
                    }
                },
            }
        },
    }
    if sp_metadata is not None:
        conf["metadata"] = {"inline": [sp_metadata]}
    config = IdPConfig()
    config.load(conf)
    return Server(config=config)


def metadata(args):
    return {"xml": create_metadata_string(None, config=server(args["idp"]).config, sign=False).decode()}


def respond(args):
    lifetime = args.get("lifetime_minutes", 5)
    idp = server(args["idp"], args["sp_metadata"], lifetime)
    request = idp.parse_authn_request(args["saml_request"], BINDING_HTTP_REDIRECT)
    if request is None:
        fail("the AuthnRequest did not parse")
    message = request.message
    sp_entity_id = message.issuer.text
    _, acs = idp.pick_binding("assertion_consumer_service", bindings=[BINDING_HTTP_POST], entity_id=sp_entity_id)
    sign = args.get("sign", "assertion")
    response = idp.create_authn_response(
        identity=args.get("attributes", {}),
        in_response_to=message.id,
        destination=args.get("destination", acs),
        sp_entity_id=args.get("audience", sp_entity_id),
        name_id=NameID(format=NAMEID_FORMAT_PERSISTENT, text=args["user"]),
        userid=args["user"],
        authn={"class_ref": "urn:oasis:names:tc:SAML:2.0:ac:classes:Password"},
        issuer=args.get("issuer"),
        sign_assertion=sign in ("assertion", "both"),
        sign_response=sign in ("response", "both"),
        sign_alg=SIG_RSA_SHA256,
        digest_alg=DIGEST_SHA256,
    )
    import base64

    return {
        "saml_response": base64.b64encode(str(response).encode()).decode(),
        "in_response_to": message.id,
        "acs": acs,
    }


def main():
    if len(sys.argv) < 2:
        fail("usage: saml_idp.py keygen DIR | metadata | respond (JSON on stdin)")
    command = sys.argv[1]
    if command == "keygen":
        if len(sys.argv) != 3:
            fail("usage: saml_idp.py keygen DIR")
        out = keygen(sys.argv[2])
    elif command in ("metadata", "respond"):
        args = json.load(sys.stdin)
        out = metadata(args) if command == "metadata" else respond(args)
    else:
        fail("unknown command " + command)
    json.dump(out, sys.stdout)


if __name__ == "__main__":
    main()
