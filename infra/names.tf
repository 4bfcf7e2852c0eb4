# Names derived from the TPU's, unique per TPU and inside each resource's limits: service
# account IDs are 6 to 30 characters, firewall rules and network tags at most 63, custom role
# IDs at most 64 with no dashes. (tests/terraform_twin links this file, so real terraform
# checks these expressions.)
locals {
  name_key       = "${substr(var.tpu_name, 0, 17)}-${substr(sha1(var.tpu_name), 0, 8)}"
  account_id     = "tpu-${local.name_key}"
  firewall_name  = "tpuctl-ssh-${local.name_key}"
  internal_name  = "tpuctl-int-${local.name_key}"
  network_tag    = "tpuctl-${local.name_key}"
  role_id_prefix = "tpuctl_${replace(local.name_key, "-", "_")}"
  labels         = merge(var.labels, { "tpuctl-run" = var.run_name })
}
