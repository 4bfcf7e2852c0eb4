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

variable "zone" {
  type        = string
  description = "Zone of the TPU node."
}

variable "bucket" {
  type        = string
  description = "The run's bucket: the account gets roles/storage.objectAdmin on it."
}

variable "corpus_bucket" {
  type        = string
  description = "A bucket the account may read (roles/storage.objectViewer), or null."
  default     = null
}

variable "allow_self_delete" {
  type        = bool
  description = "Also grant tpu.nodes.delete, so the workers can delete their own TPU."
  default     = false

  validation {
    condition     = !var.allow_self_delete || var.tpu_permission_scope == "node"
    error_message = "allow_self_delete needs tpu_permission_scope = \"node\": delete is never granted on every TPU of the project."
  }
}

variable "tpu_permission_scope" {
  type        = string
  description = "node: the TPU permissions carry an IAM condition on this TPU's resource name; project: they apply to every TPU of the project."
  default     = "node"

  validation {
    condition     = contains(["node", "project"], var.tpu_permission_scope)
    error_message = "tpu_permission_scope must be node or project."
  }
}
