# The workers' identity: objects under the run's own prefix of the bucket, read under the
# prefixes its corpus is staged in and on other corpus buckets, get on TPUs (and delete, only
# when the run may end itself). No predefined project role.

locals {
  member = "serviceAccount:${google_service_account.main.email}"

  # get: the TensorFlow driver of a pod slice resolves the slice through the TPU API.
  # operations.get: waiting on an operation of its own TPU, such as its deletion.
  tpu_permissions = concat(
    ["tpu.nodes.get", "tpu.operations.get"],
    var.allow_self_delete ? ["tpu.nodes.delete"] : [],
  )

  # Object names in IAM conditions are projects/_/buckets/BUCKET/objects/NAME; a listing is a
  # request on the bucket, whose prefix the objectListPrefix attribute holds. A prefix P covers
  # the object P itself and everything under P/, never a sibling such as P2/.
  objects = "projects/_/buckets/${var.bucket}/objects/"
  prefix_conditions = {
    for p in distinct(concat([var.run_prefix], var.read_prefixes)) : p => join(" || ", [
      "resource.name == \"${local.objects}${p}\"",
      "resource.name.startsWith(\"${local.objects}${p}/\")",
      "api.getAttribute(\"storage.googleapis.com/objectListPrefix\", \"\") == \"${p}\"",
      "api.getAttribute(\"storage.googleapis.com/objectListPrefix\", \"\").startsWith(\"${p}/\")",
    ])
  }
}

resource "google_service_account" "main" {
  project      = var.project
  account_id   = var.account_id
  display_name = "tpuctl TPU ${var.tpu_name}"
  description  = "Runs on the workers of TPU ${var.tpu_name} (tpuctl); no key is ever created."
}

# A new service account takes a while to be usable everywhere: the provider's own TPU example
# waits 60 s after creating one "to limit eventual consistency errors" (google-beta docs,
# tpu_v2_vm.html.markdown). time_sleep waits only when it is created, that is when the account
# is (its triggers follow the account's unique id), and the email output passes through it, so
# the TPU (and a queued request made after `apply`) waits for it.
resource "time_sleep" "main" {
  create_duration = "60s"

  triggers = {
    email     = google_service_account.main.email
    unique_id = google_service_account.main.unique_id
  }
}

# Not the whole bucket: it is shared by every run of the project (and holds the user's own
# objects), so objects are the workers' to change only under the run's own prefix (its
# output_dir), and to read under the prefixes its corpus is in. IAM conditions need uniform
# bucket-level access, which modules/bucket turns on.
resource "google_storage_bucket_iam_member" "run" {
  bucket = var.bucket
  role   = "roles/storage.objectAdmin"
  member = local.member

  # A condition's title is short; the prefix itself is in the expression.
  condition {
    title       = "tpuctl run ${substr(var.tpu_name, 0, 40)}"
    description = "Only the run's own objects (its output_dir prefix) of TPU ${var.tpu_name}."
    expression  = local.prefix_conditions[var.run_prefix]
  }
}

resource "google_storage_bucket_iam_member" "read" {
  for_each = toset([for p in var.read_prefixes : p if p != var.run_prefix])

  bucket = var.bucket
  role   = "roles/storage.objectViewer"
  member = local.member

  condition {
    title       = "tpuctl read ${substr(var.tpu_name, 0, 40)} ${substr(sha1(each.value), 0, 8)}"
    description = "Read the corpus of TPU ${var.tpu_name} under one prefix."
    expression  = local.prefix_conditions[each.value]
  }
}

# Every other bucket the corpus is read from (each one, not only the first).
resource "google_storage_bucket_iam_member" "corpus" {
  for_each = toset(var.corpus_buckets)

  bucket = each.value
  role   = "roles/storage.objectViewer"
  member = local.member
}

# The custom role's ID suffix. A deleted custom role keeps its ID for up to 37 days, so every
# creation gets a fresh one: a run brought down and up again must not collide with its old role.
resource "random_id" "main" {
  byte_length = 3
}

# One role per TPU, bound without a condition: IAM conditions on resource.name are honoured only
# by the services listed in cloud.google.com/iam/docs/conditions-resource-attributes, and Cloud
# TPU is not one of them, so a condition naming this TPU made the binding grant nothing (and a
# `train --down` self-delete got 403 while the TPU kept billing). The permissions therefore hold
# for every TPU of the project: see infra/README.md, "Security".
resource "google_project_iam_custom_role" "main" {
  project     = var.project
  role_id     = "${var.role_id_prefix}_${random_id.main.hex}"
  title       = "tpuctl: TPU ${var.tpu_name}"
  description = "What the workers of TPU ${var.tpu_name} may do through the TPU API (tpuctl)."
  permissions = local.tpu_permissions
}

resource "google_project_iam_member" "main" {
  project = var.project
  role    = google_project_iam_custom_role.main.name
  member  = local.member
}
