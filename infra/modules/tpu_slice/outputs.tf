output "group" {
  description = "Name of the slice's managed instance group (its VMs are GROUP-xxxx)."
  value       = google_compute_region_instance_group_manager.main.name
}

output "template" {
  description = "Name of the regional instance template."
  value       = google_compute_region_instance_template.main.name
}

output "policy" {
  description = "Name of the workload policy, or null for a one-VM slice."
  value       = local.multi_host ? google_compute_resource_policy.main[0].name : null
}
