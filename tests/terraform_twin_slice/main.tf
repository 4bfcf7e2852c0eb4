# A stand-in for infra/modules/tpu_slice that real terraform can init, apply and destroy on this
# machine: the same variables (variables.tf is a link to the module's) and outputs, and for each
# Google resource a terraform_data that sends what the provider would send to Compute Engine
# (the stand-in at TPUCTL_COMPUTE_API_ENDPOINT; nothing when it is not set) through
# compute_call.py, named after the resource type it stands for.

locals {
  multi_host  = var.hosts > 1
  network     = startswith(var.network, "projects/") ? var.network : "projects/${var.project}/global/networks/${var.network}"
  region_path = "projects/${var.project}/regions/${var.region}"
  # Optional fields as for-expressions: a conditional between objects of different attributes
  # is a type error in HCL.
  ending    = { for k, v in { instanceTerminationAction = "DELETE" } : k => v if var.provisioning_model == "SPOT" || var.max_run_seconds != null }
  run_limit = { for k, v in { maxRunDuration = { seconds = var.max_run_seconds == null ? "0" : tostring(var.max_run_seconds) } } : k => v if var.max_run_seconds != null }
  firewalls = {
    ssh = {
      name         = var.names.ssh_rule, network = local.network, direction = "INGRESS"
      description  = "tpuctl run ${var.run_name}", targetTags = [var.names.tag]
      sourceRanges = var.ssh_source_ranges, allowed = [{ IPProtocol = "tcp", ports = ["22"] }]
    }
    internal = {
      name        = var.names.internal_rule, network = local.network, direction = "INGRESS"
      description = "tpuctl run ${var.run_name}", targetTags = [var.names.tag]
      sourceTags  = [var.names.tag], allowed = [for p in ["tcp", "udp", "icmp"] : { IPProtocol = p }]
    }
  }
  reservation = merge(
    { consumeReservationType = var.reservation == null ? "NO_RESERVATION" : "SPECIFIC_RESERVATION" },
    { for k, v in { key = "compute.googleapis.com/reservation-name", values = [coalesce(var.reservation, "-")] } : k => v if var.reservation != null },
  )
  template = {
    name = var.names.template, description = "tpuctl run ${var.run_name}"
    properties = {
      machineType       = var.machine_type, labels = { "tpuctl-run" = var.run_name }
      tags              = { items = [var.names.tag] }
      disks             = [{ boot = true, autoDelete = true, initializeParams = { sourceImage = var.image } }]
      networkInterfaces = [{ network = local.network, accessConfigs = [{ name = "external", type = "ONE_TO_ONE_NAT" }] }]
      metadata = { items = [
        { key = "enable-guest-attributes", value = "TRUE" },
        { key = "ssh-keys", value = "${var.ssh_user}:${trimspace(var.ssh_public_key)}" },
        { key = "block-project-ssh-keys", value = "TRUE" },
      ] }
      scheduling = merge({ provisioningModel = var.provisioning_model, onHostMaintenance = "TERMINATE",
      automaticRestart = false }, local.ending, local.run_limit)
      reservationAffinity = local.reservation
      resourcePolicies    = local.multi_host ? [var.names.policy] : []
      serviceAccounts     = [{ email = var.service_account, scopes = ["https://www.googleapis.com/auth/cloud-platform"] }]
    }
  }
  group = merge({
    name                    = var.names.group, baseInstanceName = var.names.group, description = "tpuctl run ${var.run_name}"
    instanceTemplate        = "${local.region_path}/instanceTemplates/${var.names.template}"
    targetSize              = var.hosts, targetSizePolicy = { mode = "BULK" }
    distributionPolicy      = { targetShape = "ANY_SINGLE_ZONE", zones = [{ zone = "zones/${var.zone}" }] }
    instanceLifecyclePolicy = { defaultActionOnFailure = "DO_NOTHING" }
  }, { for k, v in { resourcePolicies = { workloadPolicy = "${local.region_path}/resourcePolicies/${var.names.policy}" } } : k => v if local.multi_host })
  call = "${path.module}/compute_call.py"
}

resource "terraform_data" "google_compute_firewall" {
  for_each = local.firewalls

  triggers_replace = each.value
  input            = { kind = "firewalls", project = var.project, region = var.region, body = each.value, script = local.call }

  provisioner "local-exec" {
    command = "python3 ${self.input.script} create '${jsonencode(self.input)}'"
  }

  provisioner "local-exec" {
    when    = destroy
    command = "python3 ${self.input.script} delete '${jsonencode(self.input)}'"
  }
}

resource "terraform_data" "google_compute_resource_policy" {
  count = local.multi_host ? 1 : 0

  triggers_replace = var.topology
  input = { kind = "policies", project = var.project, region = var.region, script = local.call, body = {
    name           = var.names.policy, description = "tpuctl run ${var.run_name}"
    workloadPolicy = { type = "HIGH_THROUGHPUT", acceleratorTopology = var.topology }
  } }

  provisioner "local-exec" {
    command = "python3 ${self.input.script} create '${jsonencode(self.input)}'"
  }

  provisioner "local-exec" {
    when    = destroy
    command = "python3 ${self.input.script} delete '${jsonencode(self.input)}'"
  }
}

resource "terraform_data" "google_compute_region_instance_template" {
  triggers_replace = local.template
  input            = { kind = "templates", project = var.project, region = var.region, body = local.template, script = local.call }

  provisioner "local-exec" {
    command = "python3 ${self.input.script} create '${jsonencode(self.input)}'"
  }

  provisioner "local-exec" {
    when    = destroy
    command = "python3 ${self.input.script} delete '${jsonencode(self.input)}'"
  }

  depends_on = [terraform_data.google_compute_resource_policy]
}

resource "terraform_data" "google_compute_region_instance_group_manager" {
  triggers_replace = local.group
  input            = { kind = "groups", project = var.project, region = var.region, body = local.group, script = local.call }

  provisioner "local-exec" {
    command = "python3 ${self.input.script} create '${jsonencode(self.input)}'"
  }

  provisioner "local-exec" {
    when    = destroy
    command = "python3 ${self.input.script} delete '${jsonencode(self.input)}'"
  }

  lifecycle {
    replace_triggered_by = [terraform_data.google_compute_region_instance_template]
  }
}
