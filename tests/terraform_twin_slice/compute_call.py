"""The twin's stand-in for what the google providers send Compute Engine for one resource of
infra/modules/tpu_slice: insert it (and follow its operation to the end) or delete it, at
TPUCTL_COMPUTE_API_ENDPOINT (nothing when that is not set). Standard library only.

    python3 compute_call.py create '{"kind": "groups", "project": "p", "region": "r", "body": {...}}'
    python3 compute_call.py delete '{"kind": "groups", "project": "p", "region": "r", "body": {...}}'
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


def main():
    endpoint = os.environ.get("TPUCTL_COMPUTE_API_ENDPOINT")
    verb, spec = sys.argv[1], json.loads(sys.argv[2])
    if not endpoint:
        return
    collection = COLLECTIONS[spec["kind"]].format(**spec)
    base = f"{endpoint}/compute/v1/{collection}"
    if verb == "create":
        follow(endpoint, call("POST", base, spec["body"]), "Creating", spec["kind"])
    else:
        follow(endpoint, call("DELETE", f"{base}/{spec['body']['name']}"), "Deleting",
               spec["kind"])


if __name__ == "__main__":
    main()
