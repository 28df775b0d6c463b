"""The remote side of a result store at an fsspec URL (s3://bucket/prefix on AWS S3, Cloudflare R2, RunPod's
S3-compatible volume API, MinIO, ...). `ResultStore` mirrors it into a local cache directory; this module only
moves files between the two.

Credentials come from the environment the filesystem library reads itself (for S3: AWS_ACCESS_KEY_ID,
AWS_SECRET_ACCESS_KEY, AWS_ENDPOINT_URL, AWS_DEFAULT_REGION); the config carries only non-secret options
(`store_options`, e.g. endpoint_url), so no config, log line or Prefect parameter ever holds a key.
"""

from __future__ import annotations

import hashlib
import os
from pathlib import Path

import fsspec

# Object stores: a PUT makes the whole object appear at once (a reader gets the old object or the new one), so a
# write there is atomic as it is; on any other filesystem a file is written under a temporary name and renamed.
OBJECT_STORES = {"s3", "s3a", "gs", "gcs", "az", "abfs", "abfss", "oci"}

def default_cache(url: str) -> Path:
    """Where a URL store is mirrored when the config names no store_cache: one directory per URL."""
    base = Path(os.environ.get("EPS_SCREEN_CACHE") or Path.home() / ".cache" / "eps-screen").expanduser()
    return base / "stores" / hashlib.sha256(url.rstrip("/").encode()).hexdigest()[:12]


class Remote:
    """Files under one URL, addressed by paths relative to it ("screen/cells/<id>/<key>/metrics.json")."""

    def __init__(self, url: str, options: dict | None = None):
        self.url = url.rstrip("/")
        # No listings cache: another machine adds files at any time, and a cached listing would hide them.
        self.fs, self.base = fsspec.core.url_to_fs(self.url, use_listings_cache=False, **(options or {}))
        protocols = self.fs.protocol if isinstance(self.fs.protocol, tuple | list) else (self.fs.protocol,)
        self.atomic = bool(OBJECT_STORES.intersection(protocols))

    def _path(self, rel: str) -> str:
        return f"{self.base}/{rel}"

    def exists(self, rel: str) -> bool:
        return self.fs.exists(self._path(rel))

    def read(self, rel: str) -> bytes:
        return self.fs.cat_file(self._path(rel))

    def open(self, rel: str):
        return self.fs.open(self._path(rel), "rb")

    def write(self, rel: str, data: bytes) -> None:
        if self.atomic:
            self.fs.pipe_file(self._path(rel), data)
            return
        tmp = self._temporary(rel)
        self.fs.pipe_file(tmp, data)
        self.fs.mv(tmp, self._path(rel))

    def delete(self, rel: str) -> None:
        self.fs.rm_file(self._path(rel))

    def get(self, rel: str, local: Path) -> bool:
        """Download to `local` (atomically: a reader never sees half a file); False if there is no such file."""
        local.parent.mkdir(parents=True, exist_ok=True)
        tmp = local.with_name(f".{local.name}.pull-{os.getpid()}")
        try:
            self.fs.get_file(self._path(rel), str(tmp))
        except FileNotFoundError:
            tmp.unlink(missing_ok=True)
            return False
        os.replace(tmp, local)
        return True

    def put(self, local: Path, rel: str) -> None:
        if self.atomic:
            self.fs.put_file(str(local), self._path(rel))
            return
        tmp = self._temporary(rel)
        self.fs.put_file(str(local), tmp)
        self.fs.mv(tmp, self._path(rel))

    def move(self, rel: str, to: str) -> bool:
        """Rename a file; False if there is none (another process moved it first)."""
        try:
            self.fs.mv(self._path(rel), self._path(to))
        except FileNotFoundError:
            return False
        return True

    def _temporary(self, rel: str) -> str:
        head, _, name = rel.rpartition("/")
        tmp = f".{name}.put-{os.urandom(6).hex()}"  # hidden: listings of finished work skip it
        return self._path(f"{head}/{tmp}" if head else tmp)

    def put_tree(self, local_dir: Path, rel: str, skip: tuple[str, ...] = ()) -> None:
        """Every file under local_dir except hidden (temporary) ones and the names in `skip`."""
        for path in sorted(p for p in local_dir.rglob("*") if p.is_file()):
            parts = path.relative_to(local_dir).parts
            if any(part.startswith(".") for part in parts) or str(path.relative_to(local_dir)) in skip:
                continue
            self.put(path, f"{rel}/{'/'.join(parts)}")

    def glob(self, pattern: str) -> list[str]:
        """Relative paths matching a glob relative to the URL."""
        prefix = f"{self.base}/"
        return sorted(p.removeprefix(prefix) for p in self.fs.glob(self._path(pattern)))

    def find(self, rel: str) -> list[str]:
        """Every file under a folder (relative to the URL; "" for all), as relative paths."""
        prefix = f"{self.base}/"
        return sorted(p.removeprefix(prefix) for p in self.fs.find(self._path(rel) if rel else self.base))

    def modified(self, rel: str) -> float:
        return self.fs.modified(self._path(rel)).timestamp()
