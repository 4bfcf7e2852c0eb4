variable "project" {
  type        = string
  description = "Project ID of the service account, its custom role and the TPU."
}

variable "account_id" {
  type        = string
  description = "Service account ID (the part of the email before @)."

  validation {
    condition     = can(regex("^[a-z][-a-z0-9]{4,28}[a-z0-9]$", var.account_id))
    error_message = "account_id must be 6 to 30 lowercase letters, digits or dashes, starting with a letter."
  }
}

variable "role_id_prefix" {
  type        = string
  description = "Start of the custom role's ID; a random suffix is added."

  validation {
    condition     = can(regex("^[a-zA-Z0-9_.]{3,56}$", var.role_id_prefix))
    error_message = "role_id_prefix must be 3 to 56 letters, digits, underscores or dots."
  }
}

variable "tpu_name" {
  type        = string
  description = "Name of the TPU node whose workers use this account."
}

variable "bucket" {
  type        = string
  description = "The run's bucket: the account gets roles/storage.objectAdmin under run_prefix and roles/storage.objectViewer under read_prefixes, nothing else in it."
}

variable "run_prefix" {
  type        = string
  description = "Object-name prefix of the run's own folder in bucket (its output_dir), without slashes at either end."

  validation {
    condition     = var.run_prefix != "" && !startswith(var.run_prefix, "/") && !endswith(var.run_prefix, "/") && !can(regex("[\"\\\\]", var.run_prefix))
    error_message = "run_prefix must be an object-name prefix without quotes, backslashes or a slash at either end."
  }
}

variable "read_prefixes" {
  type        = list(string)
  description = "Object-name prefixes in bucket the account may read (the staged corpus), without slashes at either end."

  validation {
    condition     = alltrue([for p in var.read_prefixes : p != "" && !startswith(p, "/") && !endswith(p, "/") && !can(regex("[\"\\\\]", p))])
    error_message = "read_prefixes must be object-name prefixes without quotes, backslashes or a slash at either end."
  }
}

variable "corpus_buckets" {
  type        = list(string)
  description = "Other buckets the account may read (roles/storage.objectViewer on each)."
  default     = []
}

variable "allow_self_delete" {
  type        = bool
  description = "Also grant tpu.nodes.delete, so the workers can delete their own TPU."
  default     = false
}
