"""The Ray dashboard of the cluster this process is connected to: where Ray bound it and how to
get in (``deltarl run`` prints it; ``--keep-dashboard`` holds it up)."""

from __future__ import annotations

import os
import sys

from orchestrator.cluster import ray_compat


def dashboard_info(url: str | None = None) -> dict | None:
    """The dashboard of the cluster this process is connected to: ``{"url", "auth", "login"}``,
    or None when Ray is not initialised or runs without a dashboard.

    ``url`` is the address Ray bound (8265 when free, the next free port otherwise: a second
    local cluster's dashboard is not the first one's). ``auth`` is ``token`` when Ray's token
    authentication is on (Ray >= 2.59 turns it on for a local cluster with a dashboard unless
    ``RAY_AUTH_MODE=disabled``): the dashboard then asks for the token, which ``login`` says how
    to print. ``url``: the address when known otherwise (a joined head's, from its file)."""
    if "ray" not in sys.modules:
        return None
    import ray

    if not ray.is_initialized():
        return None
    url = os.environ.get("RAY_OVERRIDE_DASHBOARD_URL") or ray_compat.node_dashboard_url() or url
    if not url:
        return None
    if "://" not in url:
        url = "http://" + url
    if not ray_compat.token_auth_on():
        return {"url": url, "auth": "disabled", "login": None}
    return {"url": url, "auth": "token", "login": login_hint()}


def login_hint() -> str:
    """How to get into a dashboard with token auth: where this environment's token is."""
    if os.environ.get("RAY_AUTH_TOKEN"):
        return "paste the token in $RAY_AUTH_TOKEN (`ray get-auth-token` prints it in this environment)"
    if os.environ.get("RAY_AUTH_TOKEN_PATH"):
        return (f"paste the token that `RAY_AUTH_TOKEN_PATH={os.environ['RAY_AUTH_TOKEN_PATH']} ray get-auth-token` "
                f"prints")
    return "paste the token that `ray get-auth-token` prints (it is in ~/.ray/auth_token)"


def dashboard_text(joined: bool = False, url: str | None = None) -> str:
    """What ``deltarl run`` prints about the dashboard (the address Ray bound, how to log in);
    ``joined``: the dashboard of a running head this process joined (it stays up with the head)."""
    info = dashboard_info(url)
    if info is None:
        return "Ray dashboard: off"
    lines = [f"Ray dashboard: {info['url']}  (Actors: this campaign's rollout actors and its progress; Jobs; "
             f"Logs; Metrics need Prometheus, docs/deployment.md)"]
    if info["login"]:
        lines.append(f"  it asks for a token: {info['login']}")
    lines.append("  it is the running head's: it stays up after the campaign" if joined
                 else "  it closes with the campaign; --keep-dashboard keeps it up afterwards")
    return "\n".join(lines)
