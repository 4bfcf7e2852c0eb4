"""SSH keys made in this process (what `ssh-keygen -t ed25519` writes, without a process).

    private = ed25519_key(tmp_path / "key")                 # and key.pub beside it
    locked = ed25519_key(tmp_path / "locked", passphrase="secret words")
"""

from __future__ import annotations

from pathlib import Path


def ed25519_key(path: Path, passphrase: str = "") -> str:
    """An OpenSSH ed25519 private key at `path` (mode 600) and its public key at `path`.pub."""
    from cryptography.hazmat.primitives import serialization
    from cryptography.hazmat.primitives.asymmetric import ed25519

    key = ed25519.Ed25519PrivateKey.generate()
    encryption = (serialization.BestAvailableEncryption(passphrase.encode()) if passphrase
                  else serialization.NoEncryption())
    path.write_bytes(key.private_bytes(serialization.Encoding.PEM,
                                       serialization.PrivateFormat.OpenSSH, encryption))
    path.chmod(0o600)
    public = key.public_key().public_bytes(serialization.Encoding.OpenSSH,
                                           serialization.PublicFormat.OpenSSH)
    Path(f"{path}.pub").write_bytes(public + b" tpuctl-test\n")
    return str(path)
