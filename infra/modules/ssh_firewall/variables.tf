variable "project" {
  type        = string
  description = "Project ID that owns the network."
}

variable "name" {
  type        = string
  description = "Name of the firewall rule."
}

variable "internal_name" {
  type        = string
  description = "Name of the firewall rule that lets the TPU's hosts reach each other."
}

variable "network" {
  type        = string
  description = "Name of the VPC network the rule applies to."
}

variable "source_ranges" {
  type        = list(string)
  description = "CIDR ranges allowed to connect to tcp/22."

  validation {
    condition     = length(var.source_ranges) > 0 && alltrue([for r in var.source_ranges : can(cidrhost(r, 0)) && !can(regex("/0$", r))])
    error_message = "source_ranges must be a non-empty list of CIDR ranges, none of them /0."
  }
}

variable "target_tag" {
  type        = string
  description = "Network tag of the instances the rule opens SSH to (the TPU's tag)."
}
