# One single-host TPU VM (v4-8: 4 chips, one worker), on demand, with a new bucket.

provider "google" {
  project = var.project
}

provider "google-beta" {
  project = var.project
}

module "tpuctl" {
  source = "../.."

  project          = var.project
  region           = "us-central2"
  zone             = "us-central2-b"
  run_name         = "single-host-example"
  tpu_name         = "single-host-example"
  accelerator_type = "v4-8"
  runtime_version  = var.runtime_version
  provisioning     = "on_demand"
  create_tpu       = true

  bucket        = var.bucket
  create_bucket = true
  run_prefix    = "single-host-example"

  ssh_source_ranges = var.ssh_source_ranges
  ssh_user          = var.ssh_user
  ssh_public_key    = var.ssh_public_key
}
