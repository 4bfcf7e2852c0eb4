"""The twin's stand-in for what google_tpu_v2_vm does: create or delete the node through the TPU
API at TPUCTL_TPU_API_ENDPOINT (nothing when it is not set), as the real provider would.

    python3 tpu_node.py create '{"project": "p", "zone": "z", "name": "n", ...}'
    python3 tpu_node.py delete '{"project": "p", "zone": "z", "name": "n", ...}'
"""

import json
import os
import sys
import time
import urllib.error
import urllib.request


def call(method: str, url: str, body: dict | None = None) -> dict | None:
    data = None if body is None else json.dumps(body).encode()
    request = urllib.request.Request(url, data=data, method=method,
                                     headers={"Content-Type": "application/json"})
    try:
        return json.loads(urllib.request.urlopen(request, timeout=30).read() or b"{}")
    except urllib.error.HTTPError as exc:
        if method == "DELETE" and exc.code == 404:
            return None
        sys.exit(f"TPU API {method} {url}: {exc.code} {exc.read().decode()[:300]}")


def wait(endpoint: str, operation: dict | None) -> None:
    """Follow a long-running operation to its end, as the provider does; fail on its error."""
    while operation and not operation.get("done"):
        time.sleep(0.05)
        operation = call("GET", f"{endpoint}/v2/{operation['name']}")
    if operation and "error" in operation:
        error = operation["error"]
        sys.exit(f"Error waiting to create Node: {error.get('status', '')} "
                 f"{error.get('message', '')}")


def main() -> None:
    endpoint = os.environ.get("TPUCTL_TPU_API_ENDPOINT")
    if not endpoint:
        return
    verb, spec = sys.argv[1], json.loads(sys.argv[2])
    nodes = f"{endpoint}/v2/projects/{spec['project']}/locations/{spec['zone']}/nodes"
    if verb == "delete":
        wait(endpoint, call("DELETE", f"{nodes}/{spec['name']}"))
        return
    wait(endpoint, call("POST", f"{nodes}?nodeId={spec['name']}", {
        "acceleratorType": spec["accelerator_type"],
        "runtimeVersion": spec["runtime_version"],
        "labels": spec["labels"],
        "metadata": {"ssh-keys": spec["ssh_keys"]},
        "schedulingConfig": {"spot": spec["provisioning"] == "spot",
                             "preemptible": spec["provisioning"] == "preemptible"},
        "networkConfig": {"enableExternalIps": False},
        "serviceAccount": {"email": spec["service_account"]},
        "tags": [spec["network_tag"]],
    }))


if __name__ == "__main__":
    main()
