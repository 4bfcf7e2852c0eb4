output "name" {
  description = "Name of the firewall rule."
  value       = google_compute_firewall.main.name
}

output "target_tag" {
  description = "Network tag that the rule opens SSH to."
  value       = var.target_tag
}
