# The same names and types as infra/outputs.tf (tests/test_infra.py checks it).

output "bucket" {
  description = "Name of the run's bucket."
  value       = local.bucket_name
}

output "tpu_name" {
  description = "Name of the TPU node."
  value       = var.create_tpu ? terraform_data.tpu_vm[0].output.name : var.tpu_name
}

output "zone" {
  description = "Zone of the TPU."
  value       = var.create_tpu ? terraform_data.tpu_vm[0].output.zone : var.zone
}

output "accelerator_type" {
  description = "TPU type and size."
  value       = var.create_tpu ? terraform_data.tpu_vm[0].output.accelerator_type : var.accelerator_type
}

output "runtime_version" {
  description = "TPU software image."
  value       = var.create_tpu ? terraform_data.tpu_vm[0].output.runtime_version : var.runtime_version
}

output "service_account" {
  description = "Email of the workers' service account."
  value       = terraform_data.service_account.output.email
}

output "bucket_created" {
  description = "Whether this module created the bucket."
  value       = var.create_bucket
}

output "tpu_created" {
  description = "Whether this module created the TPU."
  value       = var.create_tpu
}

output "network_tag" {
  description = "Network tag the SSH firewall rule opens tcp/22 to."
  value       = terraform_data.ssh_firewall.output.target_tag
}
