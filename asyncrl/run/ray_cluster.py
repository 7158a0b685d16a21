"""Access to a Ray cluster for asyncrl (``asyncrl run --launcher ray``, ``asyncrl study --launcher
ray``): Ray imported with its token authentication on (or the launch refused, in one line), a
running cluster joined or a local one started with a capped object store, and the runtime env
every asyncrl process on Ray gets (niceness 0).

Ray is an optional extra: ``pip install -e '.[ray]'``. Usage statistics stay off
(RAY_USAGE_STATS_ENABLED=0).
"""

from __future__ import annotations

import os
from pathlib import Path

RAY_MISSING = "asyncrl run --launcher ray needs Ray: pip install -e '.[ray]' (make install installs it)"
OBJECT_STORE_BYTES = 256 * 1024 * 1024  # a local cluster's object store: the roles put nothing in it
# Ray starts its workers at niceness 15 (its RAY_worker_niceness), and a role inherits it: on a busy node
# (seen beside two serial runs) a role then gets a small share of a core, the learner's tiny update took
# 1.8 s and the toy run did 9 env steps/s. Roles run at the niceness of a normal process, as Ray's own job
# supervisor does.
ROLE_RUNTIME_ENV = {"env_vars": {"RAY_worker_niceness": "0"}}


class LauncherError(RuntimeError):
    """The cluster cannot run this job (Ray missing, no node alive, a role cannot be placed)."""


def import_ray(address: str | None = None):
    """The ray module, imported with Ray's token authentication on for a cluster at ``address`` (a
    running one) or a local one (None): :func:`require_token_auth` runs first, since Ray reads
    RAY_AUTH_MODE once, when it is imported. Raises LauncherError (one line) when Ray is not
    installed or token authentication would be off."""
    require_token_auth(address)
    os.environ.setdefault("RAY_USAGE_STATS_ENABLED", "0")  # set before ray is imported: no outside host
    try:
        import ray
    except ImportError:
        raise LauncherError(RAY_MISSING) from None
    return ray


RAY_AUTH_ENV, RAY_TOKEN_ENV, RAY_TOKEN_PATH_ENV = "RAY_AUTH_MODE", "RAY_AUTH_TOKEN", "RAY_AUTH_TOKEN_PATH"
RAY_AUTH_OFF = (
    "Ray's token authentication is off for this cluster ({why}): whoever reaches it could run code on every "
    "node. Start every node and this command with RAY_AUTH_MODE=token and the head's token (ray "
    "get-auth-token --generate on the head; RAY_AUTH_TOKEN, RAY_AUTH_TOKEN_PATH or ~/.ray/auth_token on "
    "each node): docs/multi-host.md"
)


def require_token_auth(address: str | None, environ=os.environ) -> None:
    """Turn on Ray's token authentication (RAY_AUTH_MODE=token, Ray >= 2.52) in ``environ`` for this
    driver, or refuse: a local cluster started for the run gets a token of Ray's making; joining a
    running cluster (``address``) needs a token here (RAY_AUTH_TOKEN, RAY_AUTH_TOKEN_PATH or Ray's
    default ~/.ray/auth_token), the head's. Raises LauncherError when RAY_AUTH_MODE says otherwise,
    or no token is found for ``address``. (Whether the cluster's own nodes were started with token
    auth cannot be seen from a client: the recipe in docs/multi-host.md starts them so.)"""
    mode = environ.get(RAY_AUTH_ENV, "").strip().lower()
    if mode and mode != "token":
        raise LauncherError(RAY_AUTH_OFF.format(why=f"RAY_AUTH_MODE={environ[RAY_AUTH_ENV]}"))
    if address and not (
        environ.get(RAY_TOKEN_ENV) or environ.get(RAY_TOKEN_PATH_ENV) or (Path.home() / ".ray" / "auth_token").is_file()
    ):
        raise LauncherError(RAY_AUTH_OFF.format(why=f"no Ray token on this host to join {address}"))
    environ[RAY_AUTH_ENV] = "token"


def connect(address: str | None):
    """Import Ray and join the cluster at ``address`` (e.g. "10.0.0.1:6379"), or start a local one
    with a capped object store when it is None or ""; returns the ray module. Ray's token
    authentication is on either way (:func:`require_token_auth`). Raises LauncherError when Ray is
    not installed or token authentication would be off. (asyncrl run and asyncrl study --launcher ray.)"""
    ray = import_ray(address)
    kwargs = dict(include_dashboard=False, log_to_driver=False, logging_level="WARNING", namespace="asyncrl")
    if address:
        ray.init(address=address, **kwargs)
    else:
        ray.init(object_store_memory=OBJECT_STORE_BYTES, **kwargs)
    return ray
