output "name" {
  description = "Name of the firewall rule."
  value       = google_compute_firewall.main.name
}

output "target_tag" {
  description = "Network tag that the rule opens SSH to."
  value       = var.target_tag
}

output "internal_name" {
  description = "Name of the firewall rule between the TPU's own hosts."
  value       = google_compute_firewall.internal.name
}
