# A multi-host pod slice (v5litepod-16: 16 chips on 4 workers) on spot capacity, in a bucket
# that already exists, with read access to a second bucket that holds the corpus. The workers
# may delete their own TPU when the run is over.

provider "google" {
  project = var.project
}

provider "google-beta" {
  project = var.project
}

module "tpuctl" {
  source = "../.."

  project          = var.project
  region           = "us-west4"
  zone             = "us-west4-a"
  run_name         = "pod-slice-example"
  tpu_name         = "pod-slice-example"
  accelerator_type = "v5litepod-16"
  runtime_version  = var.runtime_version
  provisioning     = "spot"
  create_tpu       = true

  bucket         = var.bucket
  create_bucket  = false
  run_prefix     = "pod-slice-example"
  corpus_buckets = [var.corpus_bucket]

  ssh_source_ranges = var.ssh_source_ranges
  ssh_user          = var.ssh_user
  ssh_public_key    = var.ssh_public_key

  allow_self_delete = true
  labels            = { team = "research" }
}
