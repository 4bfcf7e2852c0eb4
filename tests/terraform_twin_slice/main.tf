# A stand-in for infra/modules/tpu_slice that real terraform can init, apply and destroy on this
# machine: the same variables (variables.tf is a link to the module's) and outputs, and for each
# Google resource a terraform_data that sends what the provider would send to Compute Engine
# (the stand-in at TPUCTL_COMPUTE_API_ENDPOINT; nothing when it is not set) through
# compute_call.py, named after the resource type it stands for.
#
# Each provisioner hands compute_call.py its input as one single-quoted shell word (a quote in
# it written as '\''). The MIG's stand-in runs after all the others (depends_on): Terraform
# saves a terraform_data in its state before its provisioner runs, and a snapshot written when
# another one finishes meanwhile would hold a MIG whose insert is not done, which the provider
# never saves (tests kill `up` at the MIG's insert).
#
# It replaces and updates as the google-beta provider's own schema says
# (services/compute/resource_compute_*.go): a change to a field that forces a new resource
# replaces its stand-in (triggers_replace holds exactly those fields); a change to any other
# field is sent as the provider's update (the *_update stand-ins, whose names are no Google
# type's, send it when those fields change: PATCH, and a MIG's new target size as resize):
# - firewall: name and direction force a new rule; the rest is patched;
# - workload policy: every workload_policy field forces a new one (the description, constant
#   here, would be patched);
# - instance template: every field forces a new one; made with name_prefix and
#   create_before_destroy, so a new one is made (here named by the prefix and a digest of what it
#   holds, as unique per content as the provider's timestamp is per creation) before the old is
#   deleted, while the MIG still uses it. Terraform runs no destroy-time provisioner for an
#   object replaced create_before_destroy, so the old template's delete is sent by the MIG's
#   update stand-in once the MIG has taken the new one: where Terraform deletes it;
# - MIG: name, region, description, base_instance_name, the zones and target_size_policy.mode
#   force a new one; its template (versions), workload policy, lifecycle and update policies are
#   patched, its target size resized.
# Several slices are several MIGs and workload policies (count over var.names.groups and
# var.names.policies), as in the module; the old template's delete is sent by the last MIG to
# take the new one. The MIGs' stand-ins run after every other resource but alongside each other:
# a snapshot written when one finishes may hold another whose insert is not done (the tests that
# kill `up` at a MIG's insert use one slice).

locals {
  multi_host  = var.hosts > 1
  network     = startswith(var.network, "projects/") ? var.network : "projects/${var.project}/global/networks/${var.network}"
  region_path = "projects/${var.project}/regions/${var.region}"
  # Optional fields as for-expressions: a conditional between objects of different attributes
  # is a type error in HCL.
  ending    = { for k, v in { instanceTerminationAction = coalesce(var.termination_action, "-") } : k => v if var.termination_action != null }
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
  template_body = {
    description = "tpuctl run ${var.run_name}"
    properties = {
      machineType = var.machine_type, labels = { "tpuctl-run" = var.run_name }
      tags        = { items = [var.names.tag] }
      disks = [{ boot = true, autoDelete = true, initializeParams = {
        sourceImage = var.image, diskType = var.boot_disk_type, diskSizeGb = tostring(var.boot_disk_gb)
      } }]
      networkInterfaces = [{ network = local.network, accessConfigs = [{ name = "external", type = "ONE_TO_ONE_NAT" }] }]
      metadata = { items = [
        { key = "enable-guest-attributes", value = "TRUE" },
        { key = "ssh-keys", value = "${var.ssh_user}:${trimspace(var.ssh_public_key)}" },
        { key = "block-project-ssh-keys", value = "TRUE" },
      ] }
      scheduling = merge({ provisioningModel = var.provisioning_model, onHostMaintenance = "TERMINATE",
      automaticRestart = false }, local.ending, local.run_limit)
      reservationAffinity = local.reservation
      serviceAccounts     = [{ email = var.service_account, scopes = ["https://www.googleapis.com/auth/cloud-platform"] }]
    }
  }
  # name_prefix: the provider adds 26 characters of unique id, 9 after a prefix over 37.
  template_name = "${var.names.template_prefix}${substr(sha256(jsonencode(local.template_body)), 0, length(var.names.template_prefix) > 37 ? 9 : 26)}"
  # Per slice: what forces a new MIG; the rest of its body is updated in place.
  group_identity = [for g in var.names.groups : {
    name        = g, region = var.region, baseInstanceName = g
    description = "tpuctl run ${var.run_name}", zones = [var.zone], mode = var.size_mode
  }]
  group_settings = [for i, g in var.names.groups : merge({
    versions                = [{ instanceTemplate = "${local.region_path}/instanceTemplates/${local.template_name}" }]
    targetSize              = var.hosts
    instanceLifecyclePolicy = { defaultActionOnFailure = "DO_NOTHING" }
    updatePolicy            = { type = "OPPORTUNISTIC", instanceRedistributionType = "NONE" }
  }, { for k, v in { resourcePolicies = { workloadPolicy = "${local.region_path}/resourcePolicies/${var.names.policies[i]}" } } : k => v if local.multi_host })]
  groups = [for i, g in var.names.groups : merge({
    name               = g, baseInstanceName = g, description = "tpuctl run ${var.run_name}"
    targetSizePolicy   = { mode = var.size_mode }
    distributionPolicy = { targetShape = "ANY_SINGLE_ZONE", zones = [{ zone = "zones/${var.zone}" }] }
  }, local.group_settings[i])]
  call = "${path.module}/compute_call.py"
}

resource "terraform_data" "google_compute_firewall" {
  for_each = local.firewalls

  triggers_replace = { name = each.value.name, direction = each.value.direction }
  input            = { kind = "firewalls", project = var.project, region = var.region, name = each.value.name, body = each.value, script = local.call }

  provisioner "local-exec" {
    command = "python3 ${self.input.script} create '${replace(jsonencode(self.input), "'", "'\\''")}'"
  }

  provisioner "local-exec" {
    when    = destroy
    command = "python3 ${self.input.script} delete '${replace(jsonencode(self.input), "'", "'\\''")}'"
  }
}

resource "terraform_data" "firewall_update" {
  for_each = local.firewalls

  triggers_replace = each.value
  input            = terraform_data.google_compute_firewall[each.key].input

  provisioner "local-exec" {
    command = "python3 ${self.input.script} update '${replace(jsonencode(self.input), "'", "'\\''")}'"
  }
}

resource "terraform_data" "google_compute_resource_policy" {
  count      = local.multi_host ? length(var.names.groups) : 0
  depends_on = [terraform_data.firewall_update]

  triggers_replace = { name = var.names.policies[count.index], region = var.region, topology = var.topology, mode = "AUTO_CONNECT", type = "HIGH_THROUGHPUT" }
  input = { kind = "policies", project = var.project, region = var.region, name = var.names.policies[count.index], script = local.call, body = {
    name           = var.names.policies[count.index], description = "tpuctl run ${var.run_name}: the slice's ICI topology"
    workloadPolicy = { type = "HIGH_THROUGHPUT", acceleratorTopology = var.topology, acceleratorTopologyMode = "AUTO_CONNECT" }
  } }

  provisioner "local-exec" {
    command = "python3 ${self.input.script} create '${replace(jsonencode(self.input), "'", "'\\''")}'"
  }

  provisioner "local-exec" {
    when    = destroy
    command = "python3 ${self.input.script} delete '${replace(jsonencode(self.input), "'", "'\\''")}'"
  }
}

resource "terraform_data" "google_compute_region_instance_template" {
  triggers_replace = local.template_body
  input            = { kind = "templates", project = var.project, region = var.region, name = local.template_name, body = merge(local.template_body, { name = local.template_name }), script = local.call }

  provisioner "local-exec" {
    command = "python3 ${self.input.script} create '${replace(jsonencode(self.input), "'", "'\\''")}'"
  }

  provisioner "local-exec" {
    when    = destroy
    command = "python3 ${self.input.script} delete '${replace(jsonencode(self.input), "'", "'\\''")}'"
  }

  lifecycle {
    create_before_destroy = true
  }
}

resource "terraform_data" "google_compute_region_instance_group_manager" {
  count = length(var.names.groups)

  triggers_replace = local.group_identity[count.index]
  input            = { kind = "groups", project = var.project, region = var.region, name = var.names.groups[count.index], body = local.groups[count.index], script = local.call, template_prefix = var.names.template_prefix }

  provisioner "local-exec" {
    command = "python3 ${self.input.script} create '${replace(jsonencode(self.input), "'", "'\\''")}'"
  }

  provisioner "local-exec" {
    when    = destroy
    command = "python3 ${self.input.script} delete '${replace(jsonencode(self.input), "'", "'\\''")}'"
  }

  depends_on = [terraform_data.google_compute_region_instance_template, terraform_data.google_compute_resource_policy, terraform_data.firewall_update]
}

resource "terraform_data" "group_update" {
  count = length(var.names.groups)

  triggers_replace = local.group_settings[count.index]
  input            = terraform_data.google_compute_region_instance_group_manager[count.index].input

  provisioner "local-exec" {
    command = "python3 ${self.input.script} update '${replace(jsonencode(self.input), "'", "'\\''")}'"
  }
}
