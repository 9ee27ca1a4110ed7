"""Whether a hub's released weights can be had here, torch-free: start-up asks it before the heavy
imports, so that ``backbone.init=timm:<name>`` without a network fails in seconds, not after the
imports, the data scan and the hub clients' minute of retries (hvp_lightning/training/weights.py
downloads; this only asks)."""

from __future__ import annotations

import os
from pathlib import Path

# The hosts the hubs' files come from (timm's come from the Hugging Face Hub; a few from URLs, rare)
HUB_URLS = {"timm": "https://huggingface.co", "torchvision": "https://download.pytorch.org"}

PROBE_S = 5.0  # a hub that accepts no connection within this many seconds is out of reach


def offline() -> bool:
    """``HF_HUB_OFFLINE=1`` (Hugging Face's switch) keeps both hubs from reaching the network: the
    project's own rule for torchvision's weights (torchvision does not read it), so that one switch
    says "this machine is offline" for every ``backbone.init`` source."""
    return os.environ.get("HF_HUB_OFFLINE", "").strip().lower() in ("1", "true", "yes", "on")


def unreachable(url: str, timeout_s: float | None = None) -> str | None:
    """Why ``url``'s host cannot be reached from here -- its name does not resolve, or it (or the
    proxy ``https_proxy`` names) accepts no TCP connection within ``timeout_s`` (:data:`PROBE_S`) --
    or None when it can. Asked before a download, because without a network the hubs' clients
    retry for about a minute, warning at every try, before they give up. DNS has no timeout of
    its own: the probe runs in a daemon thread that is waited for ``timeout_s`` at most."""
    import socket
    import threading
    import urllib.parse
    import urllib.request

    timeout_s = PROBE_S if timeout_s is None else timeout_s
    parts = urllib.parse.urlsplit(url)
    host, port = parts.hostname or "", parts.port or (443 if parts.scheme == "https" else 80)
    proxy = urllib.request.getproxies().get(parts.scheme)
    if proxy and not urllib.request.proxy_bypass(host):
        via = urllib.parse.urlsplit(proxy if "://" in proxy else f"http://{proxy}")
        host, port = via.hostname or "", via.port or 80
    said: list[str | None] = []

    def connect() -> None:
        try:
            socket.create_connection((host, port), timeout=timeout_s).close()
            said.append(None)
        except OSError as err:
            said.append(f"{host}:{port}: {err.strerror or type(err).__name__}")

    probe = threading.Thread(target=connect, daemon=True, name=f"probe {host}")
    probe.start()
    probe.join(timeout_s)
    return said[0] if said else f"{host}:{port}: no answer within {timeout_s:g} s"


def first_words(text: str, limit: int = 200) -> str:
    """The first line of ``text`` (an exception's) for a one-line message: whole sentences up to
    ``limit`` characters, else whole words and '...', not cut mid-word."""
    line = next((x.strip() for x in text.splitlines() if x.strip()), "")
    if len(line) <= limit:
        return line
    if (end := line[: limit + 1].rfind(". ")) > 0:
        return line[: end + 1]
    return line[: limit - 3].rsplit(" ", 1)[0].rstrip() + "..."


def maybe_cached(source: str) -> bool:
    """Whether ``timm:<name>`` / ``torchvision:<name>`` may already be in the local cache (then the
    network is not needed; which file exactly, only timm or torchvision can tell, after the heavy
    imports): a Hugging Face cache folder ``models--timm--<name>``, or a torchvision checkpoint
    whose file name starts with the model's."""
    scheme, _, name = source.partition(":")
    if scheme == "timm":
        hf_home = Path(os.environ.get("HF_HOME", Path.home() / ".cache" / "huggingface"))
        cache = Path(os.environ.get("HF_HUB_CACHE", hf_home / "hub"))
        arch = name.split(".")[0]
        return any(p.name == f"models--timm--{name}" or p.name.startswith(f"models--timm--{arch}.")
                   for p in cache.glob("models--timm--*"))  # fmt: skip
    torch_home = Path(
        os.environ.get("TORCH_HOME", Path(os.environ.get("XDG_CACHE_HOME", Path.home() / ".cache")) / "torch")
    )
    arch = name.split(".")[0]
    return any(p.name.startswith(f"{arch}-") for p in (torch_home / "hub" / "checkpoints").glob("*"))


def hub_out_of_reach(source: str) -> str | None:
    """Why ``source``'s hub cannot give its weights here (offline, or its host out of reach) when
    they are not in the local cache; None when they may be had."""
    if maybe_cached(source):
        return None
    if offline():
        return "HF_HUB_OFFLINE is set"
    scheme = source.partition(":")[0]
    why = unreachable(HUB_URLS[scheme])
    return None if why is None else f"the hub cannot be reached: {why}"
