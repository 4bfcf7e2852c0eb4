"""The twin's stand-in for what the google providers send Compute Engine for one resource of
infra/modules/tpu_slice: insert it, update it in place, or delete it (and follow each operation to
the end), at TPUCTL_COMPUTE_API_ENDPOINT (nothing when that is not set). Standard library only.

    python3 compute_call.py create '{"kind": "groups", "project": "p", "region": "r", "name": "n", "body": {...}}'
    python3 compute_call.py update '{...}'   # what differs: PATCH, and a MIG's size as resize
    python3 compute_call.py delete '{...}'

`update` sends what the provider's Update sends when Terraform finds the fields changed: it
reads the resource and sends only what differs (the provider sends only changed fields), a new
target size through regionInstanceGroupManagers.resize, the rest as one PATCH.
"""

import json
import os
import sys
import time
import urllib.error
import urllib.request

COLLECTIONS = {"firewalls": "projects/{project}/global/firewalls",
               "policies": "projects/{project}/regions/{region}/resourcePolicies",
               "templates": "projects/{project}/regions/{region}/instanceTemplates",
               "groups": "projects/{project}/regions/{region}/instanceGroupManagers"}
WHAT = {"firewalls": "Firewall", "policies": "ResourcePolicy",
        "templates": "RegionInstanceTemplate", "groups": "RegionInstanceGroupManager"}
# What each kind's update may change (the provider's updatable fields), as the REST body names
# them; a MIG's targetSize goes through resize.
PATCHED = {"firewalls": ("network", "description", "sourceRanges", "sourceTags", "targetTags",
                         "allowed"),
           "groups": ("versions", "instanceLifecyclePolicy", "updatePolicy",
                      "resourcePolicies")}


def call(method, url, body=None):
    data = None if body is None else json.dumps(body).encode()
    request = urllib.request.Request(url, data=data, method=method,
                                     headers={"Content-Type": "application/json"})
    try:
        return json.loads(urllib.request.urlopen(request, timeout=30).read() or b"{}")
    except urllib.error.HTTPError as exc:
        if method == "DELETE" and exc.code == 404:
            return None
        detail = json.loads(exc.read() or b"{}").get("error", {}).get("message", "")
        sys.exit(f"Error {method} {url}: googleapi: Error {exc.code}: {detail}")


def follow(endpoint, operation, verb, kind):
    """Wait for the operation as the provider does; its error ends the apply."""
    while operation and operation.get("status") != "DONE":
        time.sleep(0.05)
        path = operation["selfLink"].split("/compute/v1/", 1)[1]
        operation = call("GET", f"{endpoint}/compute/v1/{path}")
    errors = ((operation or {}).get("error") or {}).get("errors") or []
    if errors:
        sys.exit(f"Error waiting for {verb} {WHAT[kind]}: {errors[0].get('message', '')}")


def update(endpoint, url, spec):
    kind, body = spec["kind"], spec["body"]
    found = call("GET", url)
    if kind == "groups" and int(found.get("targetSize", 0)) != int(body["targetSize"]):
        follow(endpoint, call("POST", f"{url}/resize?size={int(body['targetSize'])}"),
               "Resizing", kind)
    changed = {k: body[k] for k in PATCHED.get(kind, ()) if k in body and found.get(k) != body[k]}
    if changed:
        follow(endpoint, call("PATCH", url, changed), "Updating", kind)
    if kind == "groups" and "versions" in changed:
        # The template the MIG used until now was replaced create_before_destroy: Terraform
        # deletes it now that the MIG, which depends on it, has taken the new one.
        # With several slices, the last MIG to take the new one is where that happens.
        old = (found.get("versions") or [{}])[0].get("instanceTemplate", "")
        name = old.rsplit("/", 1)[-1]
        region = url.split("/instanceGroupManagers/")[0]
        users = [g for g in call("GET", f"{region}/instanceGroupManagers").get("items", [])
                 if (g.get("versions") or [{}])[0].get("instanceTemplate", "").endswith(
                     f"/{name}")]
        if name.startswith(spec["template_prefix"]) and not users:
            follow(endpoint, call("DELETE", f"{region}/instanceTemplates/{name}"), "Deleting",
                   "templates")


def main():
    endpoint = os.environ.get("TPUCTL_COMPUTE_API_ENDPOINT")
    verb, spec = sys.argv[1], json.loads(sys.argv[2])
    if not endpoint:
        return
    collection = COLLECTIONS[spec["kind"]].format(**spec)
    base = f"{endpoint}/compute/v1/{collection}"
    if verb == "create":
        follow(endpoint, call("POST", base, spec["body"]), "Creating", spec["kind"])
    elif verb == "update":
        update(endpoint, f"{base}/{spec['name']}", spec)
    else:
        follow(endpoint, call("DELETE", f"{base}/{spec['name']}"), "Deleting", spec["kind"])


if __name__ == "__main__":
    main()
