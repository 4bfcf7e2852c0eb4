variable "project" {
  type        = string
  description = "Project ID of the TPU."
}

variable "region" {
  type        = string
  description = "Region of zone (used to name the subnetwork)."
}

variable "zone" {
  type        = string
  description = "Zone of the TPU."
}

variable "name" {
  type        = string
  description = "Name of the TPU node."
}

variable "accelerator_type" {
  type        = string
  description = "TPU type and size, e.g. v4-8 or v5litepod-16."

  validation {
    condition     = can(regex("^(v2|v3|v4|v5p|v5litepod|v6e)-[0-9]+$", var.accelerator_type))
    error_message = "accelerator_type must look like v4-8, v4-32, v5litepod-16, v5p-8 or v6e-8."
  }
}

variable "runtime_version" {
  type        = string
  description = "TPU software image."
}

variable "provisioning" {
  type        = string
  description = "on_demand, spot or preemptible."

  validation {
    condition     = contains(["on_demand", "spot", "preemptible"], var.provisioning)
    error_message = "provisioning must be one of: on_demand, spot, preemptible."
  }
}

variable "network" {
  type        = string
  description = "Name of the VPC network."
}

variable "subnetwork" {
  type        = string
  description = "Name of the subnetwork in region, or null for the network's own."
  default     = null
}

variable "enable_external_ips" {
  type        = bool
  description = "Give every worker an external IP."
}

variable "service_account_email" {
  type        = string
  description = "Email of the service account the workers run as."
}

variable "network_tag" {
  type        = string
  description = "Network tag of the workers (the SSH firewall rule targets it)."
}

variable "ssh_user" {
  type        = string
  description = "Login name that ssh_public_key is installed for."
}

variable "ssh_public_key" {
  type        = string
  description = "One OpenSSH public key line, installed through the ssh-keys metadata."
}

variable "labels" {
  type        = map(string)
  description = "Labels of the TPU node."
}

variable "description" {
  type        = string
  description = "Text description of the TPU node."
}
