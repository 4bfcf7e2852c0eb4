# The launcher's contract: launcher/terraform.py (OUTPUTS, InfraOutputs) reads exactly these
# names and types, and tests/test_infra.py keeps the two in step.

output "bucket" {
  description = "Name of the run's bucket (created here, or the existing one given)."
  value       = local.bucket_name
}

output "tpu_name" {
  description = "Name of the TPU node (created here, or to be created by a queued request)."
  value       = var.create_tpu ? module.tpu_vm[0].name : var.tpu_name
}

output "zone" {
  description = "Zone of the TPU."
  value       = var.create_tpu ? module.tpu_vm[0].zone : var.zone
}

output "accelerator_type" {
  description = "TPU type and size, e.g. v4-32."
  value       = var.create_tpu ? module.tpu_vm[0].accelerator_type : var.accelerator_type
}

output "runtime_version" {
  description = "TPU software image."
  value       = var.create_tpu ? module.tpu_vm[0].runtime_version : var.runtime_version
}

output "service_account" {
  description = "Email of the workers' service account (also for a queued request's node)."
  value       = module.service_account.email
}

output "bucket_created" {
  description = "Whether this module created (and so owns) the bucket."
  value       = var.create_bucket
}

output "tpu_created" {
  description = "Whether this module created the TPU (false: the launcher makes a queued request)."
  value       = var.create_tpu
}

output "network_tag" {
  description = "Network tag the SSH firewall rule opens tcp/22 to; a TPU made by a queued request must carry it."
  value       = local.network_tag
}
