output "name" {
  description = "Name of the bucket."
  value       = google_storage_bucket.main.name
}

output "url" {
  description = "gs:// URL of the bucket."
  value       = google_storage_bucket.main.url
}
