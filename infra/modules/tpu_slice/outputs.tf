output "groups" {
  description = "Names of the slices' managed instance groups, slice by slice (their VMs are GROUP-xxxx)."
  value       = google_compute_region_instance_group_manager.main[*].name
}

output "template" {
  description = "Name of the regional instance template."
  value       = google_compute_region_instance_template.main.name
}

output "policies" {
  description = "Names of the slices' workload policies, slice by slice (none for one-VM slices)."
  value       = google_compute_resource_policy.main[*].name
}
