# The same names as infra/modules/tpu_slice/outputs.tf.

output "group" {
  description = "Name of the slice's managed instance group (its VMs are GROUP-xxxx)."
  value       = terraform_data.google_compute_region_instance_group_manager.output.body.name
}

output "template" {
  description = "Name of the regional instance template."
  value       = terraform_data.google_compute_region_instance_template.output.body.name
}

output "policy" {
  description = "Name of the workload policy, or null for a one-VM slice."
  value       = local.multi_host ? terraform_data.google_compute_resource_policy[0].output.body.name : null
}
