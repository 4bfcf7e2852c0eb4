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
    email         = "${local.account_id}@${var.project}.iam.gserviceaccount.com"
    bucket        = local.bucket_name
    corpus_bucket = var.corpus_bucket
    permissions = concat(
      ["tpu.nodes.get", "tpu.operations.get"],
      var.allow_self_delete ? ["tpu.nodes.delete"] : [],
    )
  }
}

# Like google_tpu_v2_vm, this creates and deletes the node through the TPU API: the stand-in at
# TPUCTL_TPU_API_ENDPOINT when that is set (tests), nothing otherwise.
resource "terraform_data" "tpu_vm" {
  count = var.create_tpu ? 1 : 0

  input = {
    project          = var.project
    name             = var.tpu_name
    zone             = var.zone
    accelerator_type = var.accelerator_type
    runtime_version  = var.runtime_version
    provisioning     = var.provisioning
    service_account  = terraform_data.service_account.output.email
    network_tag      = local.network_tag
    ssh_keys         = "${var.ssh_user}:${trimspace(var.ssh_public_key)}"
    labels           = local.labels
    script           = "${path.module}/tpu_node.py"
  }

  provisioner "local-exec" {
    command = "python3 ${self.input.script} create '${jsonencode(self.input)}'"
  }

  provisioner "local-exec" {
    when    = destroy
    command = "python3 ${self.input.script} delete '${jsonencode(self.input)}'"
  }

  depends_on = [terraform_data.ssh_firewall]
}
