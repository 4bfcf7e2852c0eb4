"""`train --down` from worker 0: delete the run's own billing machines when the job ends.

    print(delete_own({"api": "compute", "project": "p", "zone": "us-east5-b",
                      "region": "us-east5", "name": "trillium", "uid": "123"}))

The launcher's provider says what to delete (launcher.providers.*.node_to_delete, as
launcher.plan.NodeToDelete); the job's agent calls `delete_own` with it and nothing else. Standard
library only, so the agent can call it with whatever Python the worker has; credentials are the
VM's service account from the metadata server (none for a stand-in endpoint, which the launcher
passes on when it used one). Each deleter checks the resource's unique id first: never one
recreated under the same name (the ownership rule).
- api "tpu" (provider gcp): the TPU node (delete_own_node).
- api "compute" (provider gce): the slice's managed instance group, which takes its VMs (worker 0
  among them) with it. Its instance template and workload policy cost nothing and cannot go
  before the MIG is gone, which worker 0 does not live to see: `tpuctl down` removes them.
"""

from __future__ import annotations

COMPUTE_ENDPOINT = "https://compute.googleapis.com"
TPU_ENDPOINT = "https://tpu.googleapis.com"
METADATA_TOKEN = ("http://metadata.google.internal/computeMetadata/v1/instance/"
                  "service-accounts/default/token")


def delete_own(spec: dict) -> str:
    """Delete what `spec` (a NodeToDelete as data) names; what was done, as one line."""
    spec = dict(spec)
    api = spec.pop("api", "tpu")
    if api == "compute":
        return delete_own_group(**spec)
    spec.pop("region", None)
    return delete_own_node(**spec)


def _delete_if_id(url: str, uid: str, api_endpoint: str | None) -> str | None:
    """GET the resource at `url` and DELETE it if its id is still `uid`; the id it had (None:
    it was already gone)."""
    import json
    import urllib.error
    import urllib.request

    headers = {}
    if not api_endpoint:
        request = urllib.request.Request(METADATA_TOKEN, headers={"Metadata-Flavor": "Google"})
        with urllib.request.urlopen(request, timeout=10) as reply:
            headers["Authorization"] = f"Bearer {json.loads(reply.read())['access_token']}"
    try:
        with urllib.request.urlopen(urllib.request.Request(url, headers=headers),
                                    timeout=30) as reply:
            found = str(json.loads(reply.read()).get("id"))
    except urllib.error.HTTPError as exc:
        if exc.code == 404:
            return None
        raise
    if found == str(uid):
        with urllib.request.urlopen(urllib.request.Request(url, method="DELETE", headers=headers),
                                    timeout=30):
            pass
    return found


def delete_own_node(*, project: str, zone: str, name: str, uid: str,
                    api_endpoint: str | None = None) -> str:
    """Delete the TPU node `name` if its id is still `uid` (the one the run made)."""
    url = f"{api_endpoint or TPU_ENDPOINT}/v2/projects/{project}/locations/{zone}/nodes/{name}"
    found = _delete_if_id(url, uid, api_endpoint)
    if found is None:
        return f"TPU {name} is already gone"
    if found != str(uid):
        return f"TPU {name} is another node now (id {found}); not deleting it"
    return f"deleting TPU {name} (the run asked for --down)"


def delete_own_group(*, project: str, zone: str, region: str | None, name: str, uid: str,
                     api_endpoint: str | None = None) -> str:
    """Delete the regional MIG `name` if its id is still `uid` (the one the run made)."""
    del zone  # the MIG is regional; the zone is where its VMs run
    url = (f"{api_endpoint or COMPUTE_ENDPOINT}/compute/v1/projects/{project}/regions/{region}/"
           f"instanceGroupManagers/{name}")
    found = _delete_if_id(url, uid, api_endpoint)
    if found is None:
        return f"slice {name} is already gone"
    if found != str(uid):
        return f"slice {name} is another instance group now (id {found}); not deleting it"
    return (f"deleting slice {name} (the run asked for --down): its instance group and VMs; "
            "`tpuctl down` removes its template and policy")
