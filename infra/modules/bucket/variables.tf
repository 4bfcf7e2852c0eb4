variable "project" {
  type        = string
  description = "Project ID that owns the bucket."
}

variable "name" {
  type        = string
  description = "Bucket name (globally unique)."

  validation {
    condition     = can(regex("^[a-z0-9][a-z0-9._-]{1,61}[a-z0-9]$", var.name))
    error_message = "name must be 3 to 63 lowercase letters, digits, dashes, underscores or dots, starting and ending with a letter or digit."
  }
}

variable "location" {
  type        = string
  description = "Region of the bucket: the TPU's region, so reads stay in the region and cost no egress."
}

variable "noncurrent_version_retention_days" {
  type        = number
  description = "Days a noncurrent (overwritten or deleted) object version is kept before it is deleted."

  validation {
    condition     = var.noncurrent_version_retention_days >= 1
    error_message = "noncurrent_version_retention_days must be at least 1."
  }
}

variable "labels" {
  type        = map(string)
  description = "Labels of the bucket."
}
