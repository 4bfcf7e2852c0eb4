terraform {
  required_version = ">= 1.9.0, < 2.0.0"

  required_providers {
    google = {
      source  = "hashicorp/google"
      version = ">= 7.0.0, < 8.0.0"
    }
    # The slice's template, MIG and workload policy: bulk mode (target_size_policy), the
    # workload policy's accelerator topology and the MIG's resource_policies are recent fields;
    # google-beta carries them first. Which 7.x release is the first with all of them is for
    # a first real `terraform init` to confirm (README, gce rows).
    google-beta = {
      source  = "hashicorp/google-beta"
      version = ">= 7.0.0, < 8.0.0"
    }
  }
}
