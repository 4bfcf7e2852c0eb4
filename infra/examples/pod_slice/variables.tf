variable "project" {
  type        = string
  description = "Google Cloud project ID."
}

variable "bucket" {
  type        = string
  description = "Name of an existing bucket of the project, used as it is and never deleted."
}

variable "corpus_bucket" {
  type        = string
  description = "Name of a bucket the workers may read the corpus from."
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
