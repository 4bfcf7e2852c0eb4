variable "project" {
  type        = string
  description = "Google Cloud project ID."
}

variable "bucket" {
  type        = string
  description = "Name of the bucket to create (globally unique)."
}

variable "runtime_version" {
  type        = string
  description = "TPU software image offered in the zone (gcloud compute tpus tpu-vm versions list --zone ZONE)."
}

variable "ssh_source_ranges" {
  type        = list(string)
  description = "CIDR ranges you connect from, e.g. [\"203.0.113.7/32\"]."
}

variable "ssh_user" {
  type        = string
  description = "Login name on the workers."
}

variable "ssh_public_key" {
  type        = string
  description = "Your SSH public key (one OpenSSH line)."
}
