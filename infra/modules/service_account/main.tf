# The workers' identity: objects in the run's bucket, read on a corpus bucket, get on its own
# TPU (and delete, only when the run may end itself). No predefined project role.

locals {
  member = "serviceAccount:${google_service_account.main.email}"

  # get: the TensorFlow driver of a pod slice resolves the slice through the TPU API.
  # operations.get: waiting on an operation of its own TPU, such as its deletion.
  tpu_permissions = concat(
    ["tpu.nodes.get", "tpu.operations.get"],
    var.allow_self_delete ? ["tpu.nodes.delete"] : [],
  )
}

resource "google_service_account" "main" {
  project      = var.project
  account_id   = var.account_id
  display_name = "tpuctl TPU ${var.tpu_name}"
  description  = "Runs on the workers of TPU ${var.tpu_name} (tpuctl); no key is ever created."
}

resource "google_storage_bucket_iam_member" "bucket" {
  bucket = var.bucket
  role   = "roles/storage.objectAdmin"
  member = local.member
}

resource "google_storage_bucket_iam_member" "corpus" {
  count = var.corpus_bucket == null ? 0 : 1

  bucket = var.corpus_bucket
  role   = "roles/storage.objectViewer"
  member = local.member
}

# The custom role's ID suffix. A deleted custom role keeps its ID for up to 37 days, so every
# creation gets a fresh one: a run brought down and up again must not collide with its old role.
resource "random_id" "main" {
  byte_length = 3
}

resource "google_project_iam_custom_role" "main" {
  project     = var.project
  role_id     = "${var.role_id_prefix}_${random_id.main.hex}"
  title       = "tpuctl: TPU ${var.tpu_name} itself"
  description = "What the workers of TPU ${var.tpu_name} may do to that TPU (tpuctl)."
  permissions = local.tpu_permissions
}

resource "google_project_iam_member" "main" {
  project = var.project
  role    = google_project_iam_custom_role.main.name
  member  = local.member

  dynamic "condition" {
    for_each = var.tpu_permission_scope == "node" ? [var.tpu_name] : []
    content {
      title       = "only TPU ${condition.value}"
      description = "Its own TPU node, and the operations of zone ${var.zone}."
      # endsWith: the project part may be the project's ID or number.
      expression = "resource.name.endsWith(\"/locations/${var.zone}/nodes/${var.tpu_name}\") || resource.name.extract(\"/locations/{zone}/operations/\") == \"${var.zone}\""
    }
  }
}
