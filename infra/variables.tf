# The launcher writes every one of these to terraform.tfvars.json (launcher/terraform.py,
# TerraformVars); the run config owns the defaults, so values that depend on the user's
# environment have none here.

variable "project" {
  type        = string
  description = "Google Cloud project ID that holds every resource of the run."

  validation {
    condition     = can(regex("^[a-z][a-z0-9-]{4,28}[a-z0-9]$", var.project))
    error_message = "project must be a project ID: 6 to 30 lowercase letters, digits or dashes, starting with a letter (not the project number or display name)."
  }
}

variable "region" {
  type        = string
  description = "Region of the bucket and of every zone the TPU may use, e.g. us-central2."

  validation {
    condition     = can(regex("^[a-z]+-[a-z]+[0-9]+$", var.region))
    error_message = "region must look like us-central2 or europe-west4."
  }
}

variable "zone" {
  type        = string
  description = "Zone of the TPU, inside region, e.g. us-central2-b."

  validation {
    condition     = can(regex("^[a-z]+-[a-z]+[0-9]+-[a-z]$", var.zone))
    error_message = "zone must look like us-central2-b."
  }

  validation {
    condition     = startswith(var.zone, "${var.region}-")
    error_message = "zone ${var.zone} is not in region ${var.region} (the bucket's region)."
  }
}

variable "run_name" {
  type        = string
  description = "The tpuctl run's name; every labelled resource carries it as label tpuctl-run."

  validation {
    condition     = can(regex("^[a-z]([-a-z0-9]{0,61}[a-z0-9])?$", var.run_name))
    error_message = "run_name must be 1 to 63 lowercase letters, digits or dashes, start with a letter and not end with a dash."
  }
}

variable "tpu_name" {
  type        = string
  description = "Name of the TPU VM or pod slice (also the node a queued request creates); the names of the service account, firewall rule and network tag derive from it."

  validation {
    condition     = can(regex("^[a-z]([-a-z0-9]{0,61}[a-z0-9])?$", var.tpu_name))
    error_message = "tpu_name must be 1 to 63 lowercase letters, digits or dashes, start with a letter and not end with a dash."
  }
}

variable "accelerator_type" {
  type        = string
  description = "TPU type and size, e.g. v4-8, v4-32, v5litepod-16, v5p-8, v6e-8 (v4/v5p count TensorCores, v5litepod/v6e count chips)."

  validation {
    condition     = can(regex("^(v2|v3|v4|v5p|v5litepod|v6e)-[0-9]+$", var.accelerator_type))
    error_message = "accelerator_type must be a generation and a size, like v4-8, v4-32, v5litepod-16, v5p-8 or v6e-8."
  }
}

variable "runtime_version" {
  type        = string
  description = "TPU software image, e.g. tpu-ubuntu2204-base or v2-alpha-tpuv5-lite (tpuctl picks the one its TensorFlow route needs)."

  validation {
    condition     = can(regex("^[a-z0-9][a-z0-9._-]{0,62}$", var.runtime_version))
    error_message = "runtime_version must be a runtime name like tpu-ubuntu2204-base: lowercase letters, digits, dots, dashes, underscores."
  }
}

variable "provisioning" {
  type        = string
  description = "How the TPU is obtained: on_demand, spot (may be taken back at any time, no 24 h limit) or preemptible (taken back at the latest after 24 h)."
  default     = "on_demand"

  validation {
    condition     = contains(["on_demand", "spot", "preemptible"], var.provisioning)
    error_message = "provisioning must be one of: on_demand, spot, preemptible."
  }
}

variable "create_tpu" {
  type        = bool
  description = "Create the TPU VM here. False when the launcher asks for the TPU through a queued resource (TPU API), or when only the bucket, firewall and service account are wanted."
}

variable "bucket" {
  type        = string
  description = "Name of the run's Cloud Storage bucket (shards, checkpoints, model)."

  validation {
    condition = alltrue([
      can(regex("^[a-z0-9][a-z0-9._-]{1,61}[a-z0-9]$", var.bucket)),
      !startswith(var.bucket, "goog"),
      !strcontains(var.bucket, "google"),
      !strcontains(var.bucket, ".."),
      !can(regex("^[0-9]+\\.[0-9]+\\.[0-9]+\\.[0-9]+$", var.bucket)),
    ])
    error_message = "bucket must be a Cloud Storage bucket name: 3 to 63 lowercase letters, digits, dashes, underscores or dots, starting and ending with a letter or digit, not an IP address, not starting with goog and not containing google."
  }
}

variable "create_bucket" {
  type        = bool
  description = "Create the bucket. False when it already exists in the project: it is then used as it is and never deleted by this module."
}

variable "noncurrent_version_retention_days" {
  type        = number
  description = "Days an overwritten or deleted object version is kept (versioning is on) before the lifecycle rule deletes it."
  default     = 7

  validation {
    condition     = var.noncurrent_version_retention_days >= 1 && var.noncurrent_version_retention_days <= 3650 && floor(var.noncurrent_version_retention_days) == var.noncurrent_version_retention_days
    error_message = "noncurrent_version_retention_days must be a whole number of days from 1 to 3650."
  }
}

variable "run_prefix" {
  type        = string
  description = "Object-name prefix of the run's own folder in bucket (its output_dir, e.g. the run's name), without slashes at either end: the workers may change objects there and nowhere else in the bucket."

  validation {
    condition     = var.run_prefix != "" && !startswith(var.run_prefix, "/") && !endswith(var.run_prefix, "/") && !can(regex("[\"\\\\]", var.run_prefix))
    error_message = "run_prefix must be an object-name prefix such as my-run, without quotes, backslashes or a slash at either end."
  }
}

variable "read_prefixes" {
  type        = list(string)
  description = "Object-name prefixes in bucket the workers may read (where the corpus is: tpuctl stages local files under corpus), without slashes at either end."
  default     = ["corpus"]

  validation {
    condition     = alltrue([for p in var.read_prefixes : p != "" && !startswith(p, "/") && !endswith(p, "/") && !can(regex("[\"\\\\]", p))])
    error_message = "read_prefixes must be object-name prefixes such as corpus, without quotes, backslashes or a slash at either end."
  }
}

variable "corpus_buckets" {
  type        = list(string)
  description = "Other buckets the workers read the corpus from (read-only access to each)."
  default     = []

  validation {
    condition     = alltrue([for b in var.corpus_buckets : can(regex("^[a-z0-9][a-z0-9._-]{1,61}[a-z0-9]$", b))])
    error_message = "corpus_buckets must be Cloud Storage bucket names (3 to 63 lowercase letters, digits, dashes, underscores or dots)."
  }
}

variable "network" {
  type        = string
  description = "Name of the VPC network of the TPU and of the SSH firewall rule."
  default     = "default"

  validation {
    condition     = can(regex("^[a-z]([-a-z0-9]{0,61}[a-z0-9])?$", var.network))
    error_message = "network must be a network name (lowercase letters, digits, dashes; up to 63), not a URL."
  }
}

variable "subnetwork" {
  type        = string
  description = "Name of the subnetwork in region for the TPU, or null for the network's subnetwork in that region."
  default     = null

  validation {
    condition     = var.subnetwork == null || can(regex("^[a-z]([-a-z0-9]{0,61}[a-z0-9])?$", var.subnetwork))
    error_message = "subnetwork must be a subnetwork name (lowercase letters, digits, dashes; up to 63), not a URL, or null."
  }
}

variable "enable_external_ips" {
  type        = bool
  description = "Give every TPU worker an external IP, so the launcher reaches it over SSH from outside the VPC. Without them the subnetwork needs Private Google Access."
  default     = true
}

variable "ssh_source_ranges" {
  type        = list(string)
  description = "CIDR ranges allowed to reach the workers on tcp/22, e.g. [\"203.0.113.7/32\"]."

  validation {
    condition     = length(var.ssh_source_ranges) > 0 && alltrue([for r in var.ssh_source_ranges : can(cidrhost(r, 0))])
    error_message = "ssh_source_ranges must be a non-empty list of CIDR ranges such as 203.0.113.7/32."
  }

  validation {
    condition     = alltrue([for r in var.ssh_source_ranges : !can(regex("/0$", r))])
    error_message = "ssh_source_ranges must not contain a /0 range: that opens SSH to the whole internet. Give the address ranges you connect from."
  }
}

variable "ssh_user" {
  type        = string
  description = "Login name on the workers that ssh_public_key is installed for."

  validation {
    condition     = can(regex("^[a-z_][a-z0-9_-]{0,31}$", var.ssh_user))
    error_message = "ssh_user must be a Linux login name: up to 32 lowercase letters, digits, underscores or dashes, not starting with a digit or dash."
  }
}

variable "ssh_public_key" {
  type        = string
  description = "The launcher's SSH public key (one OpenSSH line: type, base64 key, optional comment), installed through the TPU's ssh-keys metadata."

  validation {
    condition     = can(regex("^(ssh-ed25519|ssh-rsa|ecdsa-sha2-nistp256|ecdsa-sha2-nistp384|ecdsa-sha2-nistp521) [A-Za-z0-9+/]+={0,3}( [^\\n]*)?$", var.ssh_public_key))
    error_message = "ssh_public_key must be one OpenSSH public key line, e.g. \"ssh-ed25519 AAAA... comment\"."
  }
}

variable "labels" {
  type        = map(string)
  description = "Extra labels for the bucket and the TPU (tpuctl-run is always set to run_name)."
  default     = {}

  validation {
    condition = alltrue([
      for k, v in var.labels : can(regex("^[a-z][a-z0-9_-]{0,62}$", k)) && can(regex("^[a-z0-9_-]{0,63}$", v))
    ])
    error_message = "labels must have keys of 1 to 63 lowercase letters, digits, underscores or dashes starting with a letter, and values of up to 63 of the same characters."
  }
}

variable "allow_self_delete" {
  type        = bool
  description = "Let the workers' service account delete TPUs (tpu.nodes.delete), so a run can end its own cost. IAM cannot limit this to one TPU (see README): tpuctl's agent deletes only the node whose unique id it recorded."
  default     = false
}
