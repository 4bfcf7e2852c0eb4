# The run's bucket: private by construction, and nothing in it is lost by accident.
resource "google_storage_bucket" "main" {
  #checkov:skip=CKV_GCP_62:Usage logs need a second bucket for one run's data; admin changes are in Cloud Audit Logs, and object reads can be recorded with the project's Data Access audit logs.
  project       = var.project
  name          = var.name
  location      = upper(var.location)
  storage_class = "STANDARD"
  labels        = var.labels

  # IAM only (no per-object ACLs), and never public whatever a later binding says.
  uniform_bucket_level_access = true
  public_access_prevention    = "enforced"

  # A bucket that still holds objects is not deleted, not even by terraform destroy.
  force_destroy = false

  # An overwritten or deleted object stays recoverable for a while, then stops costing.
  versioning {
    enabled = true
  }

  lifecycle_rule {
    condition {
      days_since_noncurrent_time = var.noncurrent_version_retention_days
      # There is no `age` condition: the 6.x providers (which versions.tf allows) default this
      # to true and then send age = 0, which every object meets, so this rule for old versions
      # would delete current objects too (resource_storage_bucket.go, 6.0.0: Default true).
      send_age_if_zero = false
    }
    action {
      type = "Delete"
    }
  }
}
