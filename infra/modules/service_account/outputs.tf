output "email" {
  description = "Email of the service account, once a new one has had time to be usable (time_sleep.main)."
  value       = time_sleep.main.triggers["email"]
}

output "custom_role" {
  description = "Full name of the custom role with the TPU permissions (projects/P/roles/ID)."
  value       = google_project_iam_custom_role.main.name
}

output "tpu_permissions" {
  description = "The permissions the custom role grants."
  value       = local.tpu_permissions
}
