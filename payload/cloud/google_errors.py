"""Google Cloud API errors as one line for the user: credentials, a disabled API, quota, permission.

    TPU = GoogleApi(title="Cloud TPU API", service="tpu.googleapis.com", speaker="the TPU API",
                    permission_hint="check that your account may manage TPUs in {project}",
                    quota_hint="ask for quota", is_quota=lambda exc, message: False)
    with api_errors("my-project", "creating TPU run", TPU):
        ...                                  # a google-cloud client call

Each API's client module (payload.cloud.tpu_api, launcher.providers.gce_api) describes its API
once as a GoogleApi and wraps its calls in `api_errors`; the rules (which error means what, in
which order) are here. google.api_core is imported on first use.
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable, Iterator
from dataclasses import dataclass

from payload.core.errors import UserError

CREDENTIALS_HINT = ("run `gcloud auth application-default login` (or set "
                    "GOOGLE_APPLICATION_CREDENTIALS to a service-account key file)")


@dataclass(frozen=True, kw_only=True)
class GoogleApi:
    """How one Google API's errors read: its names, its hints, how it says "no quota"."""

    title: str  # "Cloud TPU API": "the <title> is not enabled in project ..."
    service: str  # what `gcloud services enable` takes
    speaker: str  # "<what>: <speaker> said <code>: ..." for any other error
    permission_hint: str  # may name {project}
    quota_hint: str
    is_quota: Callable[[Exception, str], bool]  # (the error, its message on one line)
    # Words in a message that say the API is off (besides the reason SERVICE_DISABLED).
    disabled_markers: tuple[str, ...] = ("has not been used in project",)


@contextlib.contextmanager
def api_errors(project: str, what: str, api: GoogleApi) -> Iterator[None]:
    """Turn `api`'s errors into one line with the API's own reason and what to do."""
    from google.api_core import exceptions as gexc
    from google.auth.exceptions import GoogleAuthError

    try:
        yield
    except GoogleAuthError as exc:
        raise UserError(f"{what}: Google Cloud credentials failed ({exc})",
                        hint=CREDENTIALS_HINT) from None
    except gexc.GoogleAPICallError as exc:
        reason = getattr(exc, "reason", None) or ""
        message = " ".join(str(exc.message or exc).split())
        if reason == "SERVICE_DISABLED" or any(m in message for m in api.disabled_markers):
            raise UserError(f"the {api.title} is not enabled in project {project}",
                            hint=f"run `gcloud services enable {api.service} --project "
                                 f"{project}`, wait a minute, then retry") from None
        # Before permission: Compute Engine answers a quota error with HTTP 403.
        if api.is_quota(exc, message):
            raise UserError(f"{what}: {message}", hint=api.quota_hint) from None
        if isinstance(exc, gexc.PermissionDenied | gexc.Forbidden | gexc.Unauthenticated):
            raise UserError(f"{what}: permission denied: {message}",
                            hint=api.permission_hint.format(project=project)) from None
        raise UserError(f"{what}: {api.speaker} said {exc.code}: {message}") from None
