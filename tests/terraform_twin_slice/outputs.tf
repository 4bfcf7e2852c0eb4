# The same names as infra/modules/tpu_slice/outputs.tf.

output "groups" {
  description = "Names of the slices' managed instance groups, slice by slice (their VMs are GROUP-xxxx)."
  value       = terraform_data.google_compute_region_instance_group_manager[*].output.body.name
}

output "template" {
  description = "Name of the regional instance template."
  value       = terraform_data.google_compute_region_instance_template.output.body.name
}

output "policies" {
  description = "Names of the slices' workload policies, slice by slice (none for one-VM slices)."
  value       = terraform_data.google_compute_resource_policy[*].output.body.name
}
