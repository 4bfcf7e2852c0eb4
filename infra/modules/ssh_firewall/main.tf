# SSH to the workers, and only from the addresses the user named; nothing else is opened.
resource "google_compute_firewall" "main" {
  project     = var.project
  name        = var.name
  network     = var.network
  description = "tpuctl: SSH to the TPU workers tagged ${var.target_tag}"
  direction   = "INGRESS"
  priority    = 1000

  source_ranges = var.source_ranges
  target_tags   = [var.target_tag]

  allow {
    protocol = "tcp"
    ports    = ["22"]
  }
}
