# Every value comes from the launcher (launcher/providers/gce_slice.py, terraform_variables),
# which derives the names from the run's name: the environment decides, so nothing has a default
# except what may be left out.

variable "project" {
  type        = string
  description = "Project ID of the slice."

  validation {
    condition     = can(regex("^[a-z][a-z0-9-]{4,28}[a-z0-9]$", var.project))
    error_message = "project must be a project ID: 6 to 30 lowercase letters, digits or dashes, starting with a letter."
  }
}

variable "region" {
  type        = string
  description = "Region of the template, MIG and workload policy, e.g. us-east5."

  validation {
    condition     = can(regex("^[a-z]+-[a-z]+[0-9]+$", var.region))
    error_message = "region must look like us-east5 or europe-west4."
  }
}

variable "zone" {
  type        = string
  description = "The one zone of region the MIG puts every VM in, e.g. us-east5-b (AI zones such as us-central1-ai1a too)."

  validation {
    condition     = can(regex("^[a-z]+-[a-z]+[0-9]+-([a-f]|ai[0-9]+[a-z]?)$", var.zone)) && startswith(var.zone, "${var.region}-")
    error_message = "zone must be a zone of region, like us-east5-b."
  }
}

variable "run_name" {
  type        = string
  description = "The tpuctl run's name; the VMs carry it as label tpuctl-run."

  validation {
    condition     = can(regex("^[a-z]([-a-z0-9]{0,61}[a-z0-9])?$", var.run_name))
    error_message = "run_name must be 1 to 63 lowercase letters, digits or dashes, start with a letter and not end with a dash."
  }
}

variable "names" {
  type = object({
    groups          = list(string)
    template_prefix = string
    policies        = list(string)
    ssh_rule        = string
    internal_rule   = string
    tag             = string
  })
  description = "Names of the slices' MIGs (one per slice, each also its VMs' base name) and of their workload policies (one per MIG, in the same order), the two firewall rules and the network tag they target, and the template's name_prefix (the google provider adds a unique suffix)."

  validation {
    condition     = alltrue([for n in flatten([var.names.groups, var.names.policies, var.names.ssh_rule, var.names.internal_rule, var.names.tag]) : can(regex("^[a-z]([-a-z0-9]{0,61}[a-z0-9])?$", n))])
    error_message = "every name must be 1 to 63 lowercase letters, digits or dashes, starting with a letter."
  }

  validation {
    condition     = length(var.names.groups) >= 1 && length(var.names.policies) == length(var.names.groups) && length(distinct(concat(var.names.groups, var.names.policies))) == 2 * length(var.names.groups)
    error_message = "names.groups must name at least one slice, names.policies one policy per slice, all distinct."
  }

  validation {
    condition     = can(regex("^[a-z][-a-z0-9]{0,53}$", var.names.template_prefix))
    error_message = "names.template_prefix must be 1 to 54 lowercase letters, digits or dashes, starting with a letter (the google provider's limit for name_prefix)."
  }
}

variable "machine_type" {
  type        = string
  description = "TPU machine type, e.g. tpu7x-standard-4t, ct6e-standard-4t, ct5p-hightpu-4t."

  validation {
    condition     = can(regex("^(tpu7x-standard-[0-9]+t|ct6e-standard-[0-9]+t|ct5p-hightpu-[0-9]+t)$", var.machine_type))
    error_message = "machine_type must be a TPU7x, v6e or v5p machine type such as tpu7x-standard-4t."
  }
}

variable "topology" {
  type        = string
  description = "The slice's chip topology, e.g. 2x2x1 or 4x4 (the workload policy's accelerator topology)."

  validation {
    condition     = can(regex("^[0-9]+x[0-9]+(x[0-9]+)?$", var.topology))
    error_message = "topology must look like 2x2x1 or 4x4."
  }
}

variable "hosts" {
  type        = number
  description = "VMs in the slice (chips of the topology / chips per VM); more than one adds the workload policy."

  validation {
    condition     = var.hosts >= 1 && floor(var.hosts) == var.hosts
    error_message = "hosts must be a whole number of at least 1."
  }
}

variable "image" {
  type        = string
  description = "Boot image or image family of the VMs: Google's TPU OS image of the generation, e.g. projects/ubuntu-os-accelerator-images/global/images/family/ubuntu-accel-2204-amd64-tpu-v5e-v5p-v6e."
}

variable "boot_disk_type" {
  type        = string
  description = "Boot disk type the machine type takes: hyperdisk-balanced (TPU7x, v6e) or pd-balanced (v5p)."

  validation {
    condition     = contains(["hyperdisk-balanced", "pd-balanced"], var.boot_disk_type)
    error_message = "boot_disk_type must be hyperdisk-balanced or pd-balanced."
  }
}

variable "boot_disk_gb" {
  type        = number
  description = "Boot disk size in GB; it holds the OS, the job's Python environment and its files."

  validation {
    condition     = var.boot_disk_gb >= 10 && floor(var.boot_disk_gb) == var.boot_disk_gb
    error_message = "boot_disk_gb must be a whole number of at least 10."
  }
}

variable "provisioning_model" {
  type        = string
  description = "Compute Engine provisioning model: STANDARD, SPOT, FLEX_START or RESERVATION_BOUND."

  validation {
    condition     = contains(["STANDARD", "SPOT", "FLEX_START", "RESERVATION_BOUND"], var.provisioning_model)
    error_message = "provisioning_model must be one of STANDARD, SPOT, FLEX_START, RESERVATION_BOUND."
  }
}

variable "size_mode" {
  type        = string
  description = "The MIG's target size mode: BULK (every VM at once or none; flex-start and reservation-bound only) or INDIVIDUAL."

  validation {
    condition     = contains(["BULK", "INDIVIDUAL"], var.size_mode) && (var.size_mode == "INDIVIDUAL" || contains(["FLEX_START", "RESERVATION_BOUND"], var.provisioning_model))
    error_message = "size_mode must be INDIVIDUAL, or BULK with a FLEX_START or RESERVATION_BOUND provisioning_model (Compute Engine takes bulk mode with those only)."
  }
}

variable "termination_action" {
  type        = string
  description = "What Compute Engine does to a VM it ends (preemption, run limit, reservation end): DELETE, or null for a STANDARD VM without a run limit."
  default     = null

  validation {
    condition     = var.termination_action == null ? true : var.termination_action == "DELETE"
    error_message = "termination_action must be DELETE or null."
  }
}

variable "max_run_seconds" {
  type        = number
  description = "Compute Engine stops and deletes the VMs after this many seconds (required for FLEX_START); null for no limit."
  default     = null

  validation {
    # HCL's || evaluates both sides: a null must not reach the comparison.
    condition     = var.max_run_seconds == null ? true : var.max_run_seconds >= 30 && var.max_run_seconds <= 604800
    error_message = "max_run_seconds must be from 30 (Compute Engine's shortest run limit) to 604800 (seven days), or null."
  }
}

variable "reservation" {
  type        = string
  description = "A specific reservation to take capacity from (its name, or projects/P/reservations/R), or null."
  default     = null
}

variable "network" {
  type        = string
  description = "VPC network of the VMs and the firewall rules: a name or projects/P/global/networks/N."
}

variable "subnetwork" {
  type        = string
  description = "Subnetwork in region (a name or a full path), or null for the network's own."
  default     = null
}

variable "ssh_source_ranges" {
  type        = list(string)
  description = "CIDR ranges allowed to reach the VMs on tcp/22."

  validation {
    condition     = length(var.ssh_source_ranges) > 0 && alltrue([for r in var.ssh_source_ranges : can(cidrhost(r, 0)) && !can(regex("/0$", r))])
    error_message = "ssh_source_ranges must be a non-empty list of CIDR ranges, none of them /0."
  }
}

variable "ssh_user" {
  type        = string
  description = "Login name on the VMs that ssh_public_key is installed for."

  validation {
    condition     = can(regex("^[a-z_][a-z0-9_-]{0,31}$", var.ssh_user))
    error_message = "ssh_user must be a Linux login name."
  }
}

variable "ssh_public_key" {
  type        = string
  description = "The launcher's SSH public key (one OpenSSH line), installed through the VMs' ssh-keys metadata."
}

variable "service_account" {
  type        = string
  description = "Email of the VMs' service account; default means the project's default compute service account."
  default     = "default"
}
