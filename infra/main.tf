# What one tpuctl run needs on Google Cloud: a bucket, SSH in from the user's addresses only,
# a service account that can change nothing but the run's own objects and TPU, and the TPU VM
# or pod slice itself. A queued TPU request is made by the launcher through the TPU API instead
# (create_tpu = false): see docs/google-cloud.md.

# Derived names (service account, firewall rule, network tag, role): names.tf.
locals {
  # With an existing bucket the name is taken as given; with a created one it comes from the
  # bucket module, so everything that uses it waits for the bucket.
  bucket_name = var.create_bucket ? module.bucket[0].name : var.bucket
}

module "bucket" {
  source = "./modules/bucket"
  count  = var.create_bucket ? 1 : 0

  project                           = var.project
  name                              = var.bucket
  location                          = var.region
  noncurrent_version_retention_days = var.noncurrent_version_retention_days
  labels                            = local.labels
}

module "ssh_firewall" {
  source = "./modules/ssh_firewall"

  project       = var.project
  name          = local.firewall_name
  internal_name = local.internal_name
  network       = var.network
  source_ranges = var.ssh_source_ranges
  target_tag    = local.network_tag
}

module "service_account" {
  source = "./modules/service_account"

  project           = var.project
  account_id        = local.account_id
  role_id_prefix    = local.role_id_prefix
  tpu_name          = var.tpu_name
  bucket            = local.bucket_name
  run_prefix        = var.run_prefix
  read_prefixes     = var.read_prefixes
  corpus_buckets    = var.corpus_buckets
  allow_self_delete = var.allow_self_delete
}

module "tpu_vm" {
  source = "./modules/tpu_vm"
  count  = var.create_tpu ? 1 : 0

  project               = var.project
  region                = var.region
  zone                  = var.zone
  name                  = var.tpu_name
  accelerator_type      = var.accelerator_type
  runtime_version       = var.runtime_version
  provisioning          = var.provisioning
  network               = var.network
  subnetwork            = var.subnetwork
  enable_external_ips   = var.enable_external_ips
  service_account_email = module.service_account.email
  network_tag           = local.network_tag
  ssh_user              = var.ssh_user
  ssh_public_key        = var.ssh_public_key
  labels                = local.labels
  description           = "tpuctl run ${var.run_name}"

  # The workers start with their permissions and SSH already in place.
  depends_on = [module.service_account, module.ssh_firewall]
}
