# The scheduling_config block the TPU is created with, as a list of zero or one block
# (tests/terraform_twin links this file, so its read-back check sees what infra writes).
# No block for on-demand: google-beta's scheduling_config forces a new TPU and is not computed,
# and the API answers an on-demand node with an empty schedulingConfig, which the provider reads
# back as no block (flattenTpuV2VmSchedulingConfig in services/tpuv2/resource_tpu_v2_vm.go). A
# block of false flags would therefore replace the TPU at every later apply.
locals {
  scheduling_config = var.provisioning == "on_demand" ? [] : [{
    preemptible = var.provisioning == "preemptible"
    spot        = var.provisioning == "spot"
  }]
}
