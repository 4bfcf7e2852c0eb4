# A stand-in for infra/ that real terraform can init, apply and destroy on this machine: the
# same variables and derived names (variables.tf and names.tf are links to infra's), the same
# outputs, and for each Google resource a terraform_data holding what it would be made with.

locals {
  bucket_name = var.create_bucket ? terraform_data.bucket[0].output.name : var.bucket
}

resource "terraform_data" "bucket" {
  count = var.create_bucket ? 1 : 0

  input = {
    name                              = var.bucket
    location                          = upper(var.region)
    noncurrent_version_retention_days = var.noncurrent_version_retention_days
    labels                            = local.labels
  }
}

resource "terraform_data" "ssh_firewall" {
  input = {
    name          = local.firewall_name
    network       = var.network
    source_ranges = var.ssh_source_ranges
    target_tag    = local.network_tag
  }
}

resource "terraform_data" "service_account" {
  input = {
    email          = "${local.account_id}@${var.project}.iam.gserviceaccount.com"
    bucket         = local.bucket_name
    run_prefix     = var.run_prefix
    read_prefixes  = var.read_prefixes
    corpus_buckets = var.corpus_buckets
    permissions = concat(
      ["tpu.nodes.get", "tpu.operations.get"],
      var.allow_self_delete ? ["tpu.nodes.delete"] : [],
    )
  }
}

# Like google_tpu_v2_vm (google-beta, services/tpuv2/resource_tpu_v2_vm.go), this creates and
# deletes the node through the TPU API: the stand-in at TPUCTL_TPU_API_ENDPOINT when that is set
# (tests), nothing otherwise. The provider forces a new TPU when one of name, zone,
# runtime_version, accelerator_type/config, cidr_block, network_config, service_account,
# scheduling_config or shielded_instance_config changes (triggers_replace here); labels,
# metadata, tags and description it updates in place (input here).
locals {
  tpu_force_new = {
    project          = var.project
    name             = var.tpu_name
    zone             = var.zone
    accelerator_type = var.accelerator_type
    runtime_version  = var.runtime_version
    network_config   = { network = var.network, subnetwork = var.subnetwork, enable_external_ips = var.enable_external_ips }
    # The account's email is fixed by its ID (a change to the account's grants keeps it).
    service_account = "${local.account_id}@${var.project}.iam.gserviceaccount.com"
    # As the provider's schema holds it: a flag left out of the block is false.
    scheduling_config = [for block in local.scheduling_config : {
      preemptible = try(block.preemptible, false)
      reserved    = try(block.reserved, false)
      spot        = try(block.spot, false)
    }]
  }
  # What the provider reads back after creating the node: tpu_node.py writes it from the API's
  # answer, flattened as the provider does (an empty schedulingConfig is no block at all).
  tpu_read_back_file = "${path.root}/tpu-read-back-${var.tpu_name}.json"
  tpu_read_back      = fileexists(local.tpu_read_back_file) ? jsondecode(file(local.tpu_read_back_file)) : null
}

resource "terraform_data" "tpu_vm" {
  count = var.create_tpu ? 1 : 0

  triggers_replace = local.tpu_force_new

  input = {
    project          = var.project
    name             = var.tpu_name
    zone             = var.zone
    accelerator_type = var.accelerator_type
    runtime_version  = var.runtime_version
    provisioning     = var.provisioning
    scheduling       = local.tpu_force_new.scheduling_config
    service_account  = local.tpu_force_new.service_account
    network_tag      = local.network_tag
    ssh_keys         = "${var.ssh_user}:${trimspace(var.ssh_public_key)}"
    labels           = local.labels
    script           = "${path.module}/tpu_node.py"
    read_back_file   = local.tpu_read_back_file
  }

  provisioner "local-exec" {
    command = "python3 ${self.input.script} create '${jsonencode(self.input)}'"
  }

  provisioner "local-exec" {
    when    = destroy
    command = "python3 ${self.input.script} delete '${jsonencode(self.input)}'"
  }

  lifecycle {
    replace_triggered_by = [terraform_data.tpu_read_back]
  }

  depends_on = [terraform_data.ssh_firewall, terraform_data.service_account]
}

# The provider's refresh: when what it read back differs from the configuration in a field that
# forces a new TPU, every plan replaces the TPU (the timestamp makes this value new each time).
resource "terraform_data" "tpu_read_back" {
  count = var.create_tpu ? 1 : 0

  input = (
    local.tpu_read_back == null
    || jsonencode(try(local.tpu_read_back.scheduling_config, null)) == jsonencode(local.tpu_force_new.scheduling_config)
    ? "as configured"
    : "scheduling_config read back as ${jsonencode(local.tpu_read_back.scheduling_config)}, configured as ${jsonencode(local.tpu_force_new.scheduling_config)} (${timestamp()})"
  )
}
