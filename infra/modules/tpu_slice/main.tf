# TPU slices on Compute Engine: the firewall rules, and per slice a workload policy that places
# its VMs in the slice's ICI topology (multi-host only) and a regional MIG in one zone, in the
# mode its provisioning model takes (bulk: every VM at once or none, for flex-start and
# reservation-bound; individual for on-demand and spot), all made from one regional instance
# template. The launcher decides the model, mode and termination action
# (launcher/providers/gce_slice.py, provisioning) and the names; this module writes them down.
#
# Several slices (multislice over the data-center network) are several MIGs in this one state,
# one per name in var.names.groups (count), each with its own workload policy: Compute Engine
# documents no field that joins MIGs into one multislice. One state makes one plan to vet and one
# destroy for all of them (all slices or none), and the rules and template serve every slice:
# every VM carries the one network tag, so the internal rule lets every slice reach every other.
# A one-slice run's MIG is main[0] (Terraform moves an earlier state's `main` there itself).
#
# A second apply with the same inputs changes nothing: every field the API reads back with a
# default is written (accelerator_topology_mode AUTO_CONNECT, the MIG's target_size_policy). A
# changed template (every field of one forces a new one) is made under a new name before the
# old one is deleted, while the MIG still uses the old one: name_prefix and
# create_before_destroy; the MIG then takes the new one in place, as it does a new target size.

locals {
  multi_host = var.hosts > 1
  slices     = length(var.names.groups)
  network    = startswith(var.network, "projects/") ? var.network : "projects/${var.project}/global/networks/${var.network}"
  subnetwork = var.subnetwork == null ? null : (startswith(var.subnetwork, "projects/") ? var.subnetwork : "projects/${var.project}/regions/${var.region}/subnetworks/${var.subnetwork}")
}

resource "google_compute_firewall" "ssh" {
  project       = var.project
  name          = var.names.ssh_rule
  network       = local.network
  description   = "tpuctl run ${var.run_name}: SSH to the slice from the user's addresses"
  direction     = "INGRESS"
  source_ranges = var.ssh_source_ranges
  target_tags   = [var.names.tag]

  allow {
    protocol = "tcp"
    ports    = ["22"]
  }
}

# The slice's VMs reach each other (JAX's coordinator, the data-center network): a custom VPC
# has no default-allow-internal rule.
resource "google_compute_firewall" "internal" {
  project     = var.project
  name        = var.names.internal_rule
  network     = local.network
  description = "tpuctl run ${var.run_name}: the slice's VMs to each other"
  direction   = "INGRESS"
  source_tags = [var.names.tag]
  target_tags = [var.names.tag]

  allow {
    protocol = "tcp"
  }
  allow {
    protocol = "udp"
  }
  allow {
    protocol = "icmp"
  }
}

resource "google_compute_resource_policy" "main" {
  provider = google-beta
  count    = local.multi_host ? local.slices : 0

  project     = var.project
  region      = var.region
  name        = var.names.policies[count.index]
  description = "tpuctl run ${var.run_name}: the slice's ICI topology"

  workload_policy {
    type                 = "HIGH_THROUGHPUT"
    accelerator_topology = var.topology
    # Optional and forcing a new policy: left out, the API's default (AUTO_CONNECT) read back
    # would replace the policy the MIG uses at the next apply.
    accelerator_topology_mode = "AUTO_CONNECT"
  }
}

resource "google_compute_region_instance_template" "main" {
  #checkov:skip=CKV_GCP_40:The launcher reaches the VMs over SSH from the user's machine; each VM has an external address and only tcp/22 from ssh_source_ranges is opened to it (google_compute_firewall.ssh).
  #checkov:skip=CKV_GCP_39:Whether TPU machine types take Shielded VM is not documented; a first real run decides (docs/first-real-run.md, gce rows).
  #checkov:skip=CKV_GCP_38:Boot disks are Google-managed encrypted; the VMs hold no data of their own (outputs go to the bucket) and are deleted with the run.
  #checkov:skip=CKV_GCP_30:The default compute service account is used until tpuctl makes a service account for gce (docs/gce.md); the scope defers to its IAM grants.
  #checkov:skip=CKV_GCP_31:The default compute service account is used until tpuctl makes a service account for gce (docs/gce.md); the scope defers to its IAM grants.
  provider = google-beta

  project      = var.project
  region       = var.region
  name_prefix  = var.names.template_prefix
  description  = "tpuctl run ${var.run_name}"
  machine_type = var.machine_type
  labels       = { "tpuctl-run" = var.run_name }
  tags         = [var.names.tag]

  disk {
    source_image = var.image
    disk_type    = var.boot_disk_type
    disk_size_gb = var.boot_disk_gb
    boot         = true
    auto_delete  = true
  }

  network_interface {
    network    = local.network
    subnetwork = local.subnetwork
    access_config {}
  }

  metadata = {
    # The guest agent publishes the VM's host keys as guest attributes only with this: the
    # launcher writes its known_hosts from them, strict from the first connection.
    "enable-guest-attributes" = "TRUE"
    "ssh-keys"                = "${var.ssh_user}:${trimspace(var.ssh_public_key)}"
    "block-project-ssh-keys"  = "TRUE"
  }

  scheduling {
    provisioning_model          = var.provisioning_model
    preemptible                 = var.provisioning_model == "SPOT"
    automatic_restart           = false
    on_host_maintenance         = "TERMINATE"
    instance_termination_action = var.termination_action

    dynamic "max_run_duration" {
      for_each = var.max_run_seconds == null ? [] : [var.max_run_seconds]
      content {
        seconds = max_run_duration.value
      }
    }
  }

  reservation_affinity {
    type = var.reservation == null ? "NO_RESERVATION" : "SPECIFIC_RESERVATION"

    dynamic "specific_reservation" {
      for_each = var.reservation == null ? [] : [var.reservation]
      content {
        key    = "compute.googleapis.com/reservation-name"
        values = [specific_reservation.value]
      }
    }
  }

  service_account {
    email  = var.service_account
    scopes = ["https://www.googleapis.com/auth/cloud-platform"]
  }

  # Every field forces a new template: the new one is made (under a new name) before the old
  # one, which the MIG uses until it takes the new one, is deleted.
  lifecycle {
    create_before_destroy = true
  }
}

resource "google_compute_region_instance_group_manager" "main" {
  provider = google-beta
  count    = local.slices

  project            = var.project
  region             = var.region
  name               = var.names.groups[count.index]
  base_instance_name = var.names.groups[count.index]
  description        = "tpuctl run ${var.run_name}"
  target_size        = var.hosts
  # The launcher waits itself, with visible progress (bulk operation, VMs, applied topology).
  wait_for_instances = false

  version {
    instance_template = google_compute_region_instance_template.main.self_link
  }

  distribution_policy_zones        = [var.zone]
  distribution_policy_target_shape = "ANY_SINGLE_ZONE"

  # BULK: all VMs at once or none (flex-start, reservation-bound); INDIVIDUAL otherwise. A VM
  # that fails is kept for inspection, not recreated.
  target_size_policy {
    mode = var.size_mode
  }

  instance_lifecycle_policy {
    default_action_on_failure = "DO_NOTHING"
  }

  dynamic "resource_policies" {
    for_each = local.multi_host ? [google_compute_resource_policy.main[count.index].self_link] : []
    content {
      workload_policy = resource_policies.value
    }
  }

  update_policy {
    type                         = "OPPORTUNISTIC"
    minimal_action               = "REPLACE"
    instance_redistribution_type = "NONE"
    max_surge_fixed              = 0
    max_unavailable_fixed        = 1
  }
}
