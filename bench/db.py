"""A throwaway PostgreSQL database per run, and what the report says about the machine."""

from __future__ import annotations

import os
import secrets
import subprocess

import asyncpg
from sqlalchemy.engine import make_url

DEFAULT_ADMIN_URL = "postgresql://postgres@127.0.0.1:5432/postgres"


def new_database_name() -> str:
    return f"episodic_bench_{secrets.token_hex(4)}"


def database_url(admin_url: str, name: str) -> str:
    """``admin_url`` pointing at database ``name``, in the plain form asyncpg takes."""
    url = make_url(admin_url).set(drivername="postgresql", database=name)
    return url.render_as_string(hide_password=False)


async def create_database(admin_url: str, name: str) -> None:
    conn = await asyncpg.connect(
        database_url(admin_url, make_url(admin_url).database or "postgres")
    )
    try:
        await conn.execute(f'CREATE DATABASE "{name}"')
    finally:
        await conn.close()


async def drop_database(admin_url: str, name: str) -> None:
    conn = await asyncpg.connect(
        database_url(admin_url, make_url(admin_url).database or "postgres")
    )
    try:
        await conn.execute(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')
    finally:
        await conn.close()


async def server_version(url: str) -> str:
    conn = await asyncpg.connect(url)
    try:
        return str(await conn.fetchval("SELECT version()"))
    finally:
        await conn.close()


def machine() -> dict[str, str]:
    """Date (``date -u``), CPUs (``nproc``) and memory."""
    try:
        date = subprocess.run(["date", "-u"], capture_output=True, text=True, check=True).stdout
    except (OSError, subprocess.CalledProcessError):
        date = "unknown"
    memory = "unknown"
    try:
        with open("/proc/meminfo") as f:
            for line in f:
                if line.startswith("MemTotal:"):
                    memory = f"{int(line.split()[1]) / 1024 / 1024:.1f} GiB"
                    break
    except OSError:
        pass
    cpus = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count()
    return {"date": date.strip(), "nproc": str(cpus), "memory": memory}
