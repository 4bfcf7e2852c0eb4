output "bucket" {
  description = "Name of the run's bucket."
  value       = module.tpuctl.bucket
}

output "tpu_name" {
  description = "Name of the TPU node."
  value       = module.tpuctl.tpu_name
}

output "zone" {
  description = "Zone of the TPU."
  value       = module.tpuctl.zone
}

output "service_account" {
  description = "Email of the workers' service account."
  value       = module.tpuctl.service_account
}
