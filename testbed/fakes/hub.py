"""A local Hugging Face Hub HTTP API for tests, spoken to by the real `huggingface_hub` client.

    with FakeHub() as hub:                       # in this process, on a free port
        hub.add_token("hf_abc", user="alice", orgs={"lab": "write"})
        os.environ["HF_ENDPOINT"] = hub.url      # or HfApi(endpoint=hub.url)
        HfApi(endpoint=hub.url, token="hf_abc").create_repo("alice/m")
        hub.repos["alice/m"].files["config.json"]                 # bytes, as committed
        [r.path for r in hub.requests if r.method == "PUT"]

What it serves, in the shapes huggingface_hub 0.36 reads and writes (hf_api.py whoami,
create_repo, create_commit, _validate_yaml; _commit_api.py _fetch_upload_modes,
_prepare_commit_payload; lfs.py post_lfs_batch_info, lfs_upload, _upload_multi_part):
- GET  /api/whoami-v2                           who a bearer token is, its role and orgs
- POST /api/repos/create                        409 when it exists; 403 without write access
- GET  /api/models/OWNER/NAME[/revision/REV]    repo info (sha, private, siblings)
- POST /api/validate-yaml                       a model card's metadata: accepted
- POST /api/models/OWNER/NAME/preupload/REV     "lfs" for binary samples and large files
- POST /OWNER/NAME.git/info/lfs/objects/batch   LFS batch: basic transfer, or multipart (parts
                                                of `multipart_chunk` bytes, then a completion
                                                POST) for objects over `multipart_threshold`;
                                                always "transfer": "basic", so Xet is never
                                                negotiated, whatever the client offers
- PUT  /_lfs/OID, PUT /_lfs/OID/part/N, POST /_lfs/OID/complete, POST /_lfs/OID/verify
                                                the uploads; contents checked against the oid
- POST /api/models/OWNER/NAME/commit/REV        NDJSON: header, file (base64), lfsFile
Anything else (a Xet token route among them) is a 404, and recorded like every request.
Errors carry X-Error-Code / X-Error-Message headers and {"error": ...} as the Hub does.
"""

from __future__ import annotations

import base64
import hashlib
import json
import re
import secrets
import threading
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from urllib.parse import urlsplit

WRITING_ROLES = ("admin", "write", "contributor")


@dataclass
class Request:
    method: str
    path: str
    token: str | None  # the bearer token it carried
    body: bytes


@dataclass
class Repo:
    owner: str
    name: str
    private: bool
    files: dict[str, bytes] = field(default_factory=dict)
    lfs_files: set[str] = field(default_factory=set)  # paths committed as LFS pointers
    commits: list[dict] = field(default_factory=list)
    sha: str = "0" * 40


class FakeHub:
    def __init__(self, *, multipart_threshold: int = 5 << 20, multipart_chunk: int = 1 << 20,
                 lfs_threshold: int = 10 << 20):
        self.multipart_threshold = multipart_threshold
        self.multipart_chunk = multipart_chunk
        self.lfs_threshold = lfs_threshold
        self.tokens: dict[str, dict] = {}
        self.repos: dict[str, Repo] = {}
        self.lfs: dict[str, bytes] = {}  # oid -> content, once uploaded and checked
        self.parts: dict[str, dict[int, bytes]] = {}
        self.requests: list[Request] = []
        self.offered_transfers: list[list[str]] = []  # what each LFS batch request offered
        self._lock = threading.Lock()
        self._server: ThreadingHTTPServer | None = None

    # --- set-up ------------------------------------------------------------------------

    def add_token(self, token: str, *, user: str, role: str = "write",
                  orgs: dict[str, str] | None = None, scoped: list[dict] | None = None) -> None:
        """A token of `user` with a role (read | write | fineGrained); `orgs`: org -> the
        user's role there; `scoped`: a fine-grained token's [{entity: {name}, permissions}]."""
        self.tokens[token] = {"user": user, "role": role, "orgs": orgs or {}, "scoped": scoped}

    @property
    def url(self) -> str:
        assert self._server is not None
        host, port = self._server.server_address[:2]
        return f"http://{host}:{port}"

    def __enter__(self) -> FakeHub:
        hub = self

        class Handler(_Handler):
            fake = hub

        self._server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self._server.daemon_threads = True
        threading.Thread(target=self._server.serve_forever, daemon=True).start()
        return self

    def __exit__(self, *exc) -> None:
        if self._server is not None:
            self._server.shutdown()
            self._server.server_close()

    # --- rules -------------------------------------------------------------------------

    def who(self, token: str | None) -> dict | None:
        return self.tokens.get(token or "")

    def may_write(self, token: str | None, owner: str) -> bool:
        who = self.who(token)
        if who is None or who["role"] == "read":
            return False
        if who["role"] == "fineGrained":
            return any(e["entity"]["name"] == owner and "repo.write" in e["permissions"]
                       for e in who["scoped"] or [])
        return owner == who["user"] or who["orgs"].get(owner) in WRITING_ROLES

    def whoami(self, token: str) -> dict:
        who = self.tokens[token]
        access = {"displayName": "tests", "role": who["role"]}
        if who["role"] == "fineGrained":
            access["fineGrained"] = {"canReadGatedRepos": False, "global": [],
                                     "scoped": who["scoped"] or []}
        return {"type": "user", "id": hashlib.sha1(who["user"].encode()).hexdigest()[:24],
                "name": who["user"], "fullname": who["user"].title(), "email": None,
                "canPay": False, "isPro": False, "periodEnd": None,
                "orgs": [{"type": "org", "name": org, "fullname": org, "roleInOrg": role}
                         for org, role in who["orgs"].items()],
                "auth": {"type": "access_token", "accessToken": access}}


class HubError(Exception):
    def __init__(self, status: int, message: str, code: str | None = None, **extra):
        super().__init__(message)
        self.status, self.message, self.code, self.extra = status, message, code, extra


_REPO = r"(?P<repo>[\w.-]+/[\w.-]+)"
_ROUTES: list[tuple[str, re.Pattern, str]] = [
    ("GET", re.compile(r"^/api/whoami-v2$"), "whoami"),
    ("POST", re.compile(r"^/api/repos/create$"), "create_repo"),
    ("POST", re.compile(r"^/api/validate-yaml$"), "validate_yaml"),
    ("GET", re.compile(rf"^/api/models/{_REPO}(/revision/[^/]+)?$"), "repo_info"),
    ("POST", re.compile(rf"^/api/models/{_REPO}/preupload/[^/]+$"), "preupload"),
    ("POST", re.compile(rf"^/{_REPO}\.git/info/lfs/objects/batch$"), "lfs_batch"),
    ("PUT", re.compile(r"^/_lfs/(?P<oid>[0-9a-f]{64})$"), "lfs_put"),
    ("PUT", re.compile(r"^/_lfs/(?P<oid>[0-9a-f]{64})/part/(?P<n>\d+)$"), "lfs_part"),
    ("POST", re.compile(r"^/_lfs/(?P<oid>[0-9a-f]{64})/complete$"), "lfs_complete"),
    ("POST", re.compile(r"^/_lfs/(?P<oid>[0-9a-f]{64})/verify$"), "lfs_verify"),
    ("POST", re.compile(rf"^/api/models/{_REPO}/commit/[^/]+$"), "commit"),
]


class _Handler(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"
    fake: FakeHub

    def log_message(self, *args) -> None:  # quiet
        pass

    def do_GET(self):
        self._serve("GET")

    def do_POST(self):
        self._serve("POST")

    def do_PUT(self):
        self._serve("PUT")

    def _body(self) -> bytes:
        if self.headers.get("Transfer-Encoding", "").lower() == "chunked":
            data = b""
            while True:
                size = int(self.rfile.readline().split(b";")[0].strip(), 16)
                if size == 0:
                    while self.rfile.readline() not in (b"\r\n", b"\n", b""):
                        pass
                    return data
                data += self.rfile.read(size)
                self.rfile.readline()
        return self.rfile.read(int(self.headers.get("Content-Length") or 0))

    def _serve(self, method: str) -> None:
        path = urlsplit(self.path).path
        body = self._body()
        auth = self.headers.get("Authorization", "")
        token = auth[len("Bearer "):] if auth.startswith("Bearer ") else None
        fake = self.fake
        with fake._lock:
            fake.requests.append(Request(method, path, token, body))
        try:
            for verb, pattern, name in _ROUTES:
                match = pattern.match(path)
                if verb == method and match:
                    with fake._lock:
                        status, payload, headers = getattr(self, name)(
                            token, body, **match.groupdict())
                    break
            else:
                raise HubError(404, f"{method} {path}: not served here", "EntryNotFound")
        except HubError as exc:
            status, payload = exc.status, {"error": exc.message, **exc.extra}
            headers = {"X-Error-Message": exc.message}
            if exc.code:
                headers["X-Error-Code"] = exc.code
        data = json.dumps(payload).encode()
        self.send_response(status)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(data)))
        for key, value in headers.items():
            self.send_header(key, value)
        self.end_headers()
        self.wfile.write(data)

    # --- routes: (status, JSON payload, extra headers) ----------------------------------

    def _writer(self, token: str | None, owner: str) -> None:
        if self.fake.who(token) is None:
            raise HubError(401, "Invalid credentials in Authorization header")
        if not self.fake.may_write(token, owner):
            raise HubError(403, f"You don't have the rights to write to {owner}")

    def _repo(self, repo: str) -> Repo:
        if repo not in self.fake.repos:
            raise HubError(404, "Repository not found", "RepoNotFound")
        return self.fake.repos[repo]

    def whoami(self, token, body):
        if self.fake.who(token) is None:
            raise HubError(401, "Invalid credentials in Authorization header")
        return 200, self.fake.whoami(token), {}

    def create_repo(self, token, body):
        spec = json.loads(body)
        who = self.fake.who(token)
        if who is None:
            raise HubError(401, "Invalid credentials in Authorization header")
        owner = spec.get("organization") or who["user"]
        repo_id = f"{owner}/{spec['name']}"
        if repo_id in self.fake.repos:  # the Hub answers 409 first, with or without rights
            raise HubError(409, "You already created this model repo",
                           url=f"{self.fake.url}/{repo_id}")
        self._writer(token, owner)
        self.fake.repos[repo_id] = Repo(owner=owner, name=spec["name"],
                                        private=bool(spec.get("private")))
        return 200, {"url": f"{self.fake.url}/{repo_id}", "name": repo_id}, {}

    def validate_yaml(self, token, body):
        return 200, {"errors": [], "warnings": []}, {}

    def repo_info(self, token, body, repo):
        found = self._repo(repo)
        return 200, {"id": repo, "modelId": repo, "sha": found.sha, "private": found.private,
                     "siblings": [{"rfilename": p} for p in sorted(found.files)]}, {}

    def preupload(self, token, body, repo):
        found = self._repo(repo)
        self._writer(token, found.owner)
        files = []
        for entry in json.loads(body)["files"]:
            sample = base64.b64decode(entry["sample"])
            lfs = entry["size"] >= self.fake.lfs_threshold or b"\0" in sample
            files.append({"path": entry["path"], "uploadMode": "lfs" if lfs else "regular",
                          "shouldIgnore": False, "oid": None})
        return 200, {"files": files, "commitOid": found.sha}, {}

    def lfs_batch(self, token, body, repo):
        found = self._repo(repo)
        self._writer(token, found.owner)
        request = json.loads(body)
        self.fake.offered_transfers.append(list(request.get("transfers", [])))
        objects = []
        for obj in request["objects"]:
            oid, size = obj["oid"], obj["size"]
            entry = {"oid": oid, "size": size, "authenticated": True}
            if oid not in self.fake.lfs:
                base = f"{self.fake.url}/_lfs/{oid}"
                if size > self.fake.multipart_threshold:
                    chunk = self.fake.multipart_chunk
                    count = -(-size // chunk)
                    header = {"chunk_size": str(chunk),
                              **{str(n): f"{base}/part/{n}" for n in range(1, count + 1)}}
                    upload = {"href": f"{base}/complete", "header": header}
                else:
                    upload = {"href": base}
                entry["actions"] = {"upload": upload, "verify": {"href": f"{base}/verify"}}
            objects.append(entry)
        # Only the basic adapter (multipart rides on it): never "xet".
        return 200, {"transfer": "basic", "objects": objects}, {}

    def _store(self, oid: str, data: bytes) -> None:
        if hashlib.sha256(data).hexdigest() != oid:
            raise HubError(400, f"the uploaded content does not hash to {oid}")
        self.fake.lfs[oid] = data

    def lfs_put(self, token, body, oid):
        self._store(oid, body)
        return 200, {}, {}

    def lfs_part(self, token, body, oid, n):
        self.fake.parts.setdefault(oid, {})[int(n)] = body
        etag = hashlib.md5(body).hexdigest()
        return 200, {}, {"ETag": f'"{etag}"'}

    def lfs_complete(self, token, body, oid):
        request = json.loads(body)
        parts = self.fake.parts.pop(oid, {})
        numbers = [p["partNumber"] for p in request["parts"]]
        if request["oid"] != oid or numbers != sorted(parts) or any(
                p["etag"].strip('"') != hashlib.md5(parts[p["partNumber"]]).hexdigest()
                for p in request["parts"]):
            raise HubError(400, "multipart completion does not match the uploaded parts")
        self._store(oid, b"".join(parts[n] for n in numbers))
        return 200, {}, {}

    def lfs_verify(self, token, body, oid):
        request = json.loads(body)
        if self.fake.lfs.get(oid) is None or len(self.fake.lfs[oid]) != request["size"]:
            raise HubError(404, f"object {oid} was not uploaded")
        return 200, {}, {}

    def commit(self, token, body, repo):
        found = self._repo(repo)
        self._writer(token, found.owner)
        lines = [json.loads(line) for line in body.decode().splitlines() if line.strip()]
        if not lines or lines[0]["key"] != "header":
            raise HubError(400, "a commit starts with its header")
        changes: dict[str, tuple[bytes, bool]] = {}
        for line in lines[1:]:
            value = line["value"]
            if line["key"] == "file":
                changes[value["path"]] = (base64.b64decode(value["content"]), False)
            elif line["key"] == "lfsFile":
                data = self.fake.lfs.get(value["oid"])
                if data is None or len(data) != value.get("size", len(data)):
                    raise HubError(400, f"LFS object {value['oid']} of {value['path']} was "
                                   "never uploaded")
                changes[value["path"]] = (data, True)
            else:
                raise HubError(400, f"unsupported commit operation {line['key']}")
        for path, (data, lfs) in changes.items():
            found.files[path] = data
            (found.lfs_files.add if lfs else found.lfs_files.discard)(path)
        found.sha = secrets.token_hex(20)
        found.commits.append({"header": lines[0]["value"], "paths": sorted(changes),
                              "sha": found.sha})
        return 200, {"commitUrl": f"{self.fake.url}/{repo}/commit/{found.sha}",
                     "commitOid": found.sha, "pullRequestUrl": None}, {}
