# The TPU VM or pod slice. Labels, metadata, tags and description are updated in place; every
# other argument forces a new TPU when it changes (google-beta resource_tpu_v2_vm.go, ForceNew).
# Worker i of a slice is network_endpoints[i].
resource "google_tpu_v2_vm" "main" {
  #checkov:skip=CKV2_GCP_32:The launcher reaches the workers over SSH from the user's machine; external IPs are on by default (enable_external_ips) and only tcp/22 from ssh_source_ranges is opened to them.
  provider = google-beta

  project          = var.project
  zone             = var.zone
  name             = var.name
  accelerator_type = var.accelerator_type
  runtime_version  = var.runtime_version
  description      = var.description
  labels           = var.labels

  # Only for spot or preemptible: scheduling.tf says why.
  dynamic "scheduling_config" {
    for_each = local.scheduling_config
    content {
      preemptible = scheduling_config.value.preemptible
      spot        = scheduling_config.value.spot
    }
  }

  # Full resource paths, as the API returns them, so a second apply sees no difference.
  network_config {
    network             = "projects/${var.project}/global/networks/${var.network}"
    subnetwork          = var.subnetwork == null ? null : "projects/${var.project}/regions/${var.region}/subnetworks/${var.subnetwork}"
    enable_external_ips = var.enable_external_ips
  }

  service_account {
    email = var.service_account_email
    # The scope lets any API through; what the account may do is decided by its IAM grants.
    scope = ["https://www.googleapis.com/auth/cloud-platform"]
  }

  tags = [var.network_tag]

  metadata = {
    "ssh-keys" = "${var.ssh_user}:${trimspace(var.ssh_public_key)}"
  }
}
