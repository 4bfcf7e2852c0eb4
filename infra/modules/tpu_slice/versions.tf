terraform {
  required_version = ">= 1.9.0, < 2.0.0"

  required_providers {
    google = {
      source  = "hashicorp/google"
      version = ">= 7.0.0, < 8.0.0"
    }
    # The slice's template, MIG and workload policy use recent fields, read in the provider's
    # own sources (services/compute): the workload policy's accelerator_topology_mode since
    # 7.24, the regional MIG's target_size_policy since 7.28 and its
    # resource_policies.workload_policy since 7.31.
    google-beta = {
      source  = "hashicorp/google-beta"
      version = ">= 7.31.0, < 8.0.0"
    }
  }
}
