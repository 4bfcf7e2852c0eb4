output "name" {
  description = "Name of the TPU node."
  value       = google_tpu_v2_vm.main.name
}

output "zone" {
  description = "Zone of the TPU node."
  value       = google_tpu_v2_vm.main.zone
}

output "accelerator_type" {
  description = "TPU type and size."
  value       = google_tpu_v2_vm.main.accelerator_type
}

output "runtime_version" {
  description = "TPU software image."
  value       = google_tpu_v2_vm.main.runtime_version
}

output "network_endpoints" {
  description = "One entry per worker (ip_address, port, access_config.external_ip); the launcher reads them from the TPU API at every start instead."
  value       = google_tpu_v2_vm.main.network_endpoints
}
