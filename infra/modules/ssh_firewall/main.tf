# SSH to the workers, and only from the addresses the user named; besides it only the
# workers' traffic to each other (below) is opened.
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

# The hosts of a pod slice talk to each other: TensorFlow's TPU worker servers (8470), JAX's
# coordinator (8476) and the TPU runtime's own ports between hosts. The default network's
# default-allow-internal rule covers this; a custom VPC has nothing, and a slice there hangs at
# start-up. Only the TPU's own hosts (its network tag) to the same hosts: all TCP and UDP
# between them, since the runtime's inter-host ports are not all documented; no other source.
resource "google_compute_firewall" "internal" {
  project     = var.project
  name        = var.internal_name
  network     = var.network
  description = "tpuctl: the TPU workers tagged ${var.target_tag} reach each other"
  direction   = "INGRESS"
  priority    = 1000

  source_tags = [var.target_tag]
  target_tags = [var.target_tag]

  allow {
    protocol = "tcp"
  }
  allow {
    protocol = "udp"
  }
  allow {
    protocol = "icmp"
  }
}
