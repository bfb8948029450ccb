@crd
Feature: The CoderProvisioner CRD and what the API server admits
  The CRDs are installed and the API server itself refuses a malformed CoderProvisioner,
  with a message the user understands, before any operator sees it. Submissions here are
  dry runs: admission runs, nothing is stored.

  @R-CRD-1 @R-CRD-2 @core
  Scenario: The CRDs are Established
    Then the CRD "coderprovisioners.coder.com" is Established
    And the CRD "codercontrolplanes.coder.com" is Established

  @R-CRD-3 @extended
  Scenario: kubectl shows the phase, the ready replicas and the age
    Then the CRD "coderprovisioners.coder.com" shows the columns:
      | name     | type    | jsonPath                    |
      | Phase    | string  | .status.phase               |
      | Replicas | integer | .status.readyReplicas       |
      | Age      | date    | .metadata.creationTimestamp |

  @R-CRD-4 @tutorial @core
  Scenario: The tutorial's sample is accepted
    When the sample provisioner is submitted
    Then the API server accepts it

  @R-CRD-4 @core
  Scenario: A provisioner without spec.controlPlaneRef is rejected
    When a provisioner is submitted with spec:
      """
      replicas: 1
      """
    Then the API server rejects it with a message mentioning:
      | spec.controlPlaneRef |
      | Required value       |

  @R-CRD-7 @R-CRD-13 @D-4 @core
  Scenario: A key name of 65 characters is rejected
    When a provisioner is submitted with a spec of:
      """
      controlPlaneRef:
        name: codercontrolplane-sample
      key:
        name: {65 x a}
      """
    Then the API server rejects it with a message mentioning:
      | spec.key.name |
      | 64            |

  @R-CRD-7 @D-4 @core
  Scenario: A key name of 64 characters is accepted
    When a provisioner is submitted with a spec of:
      """
      controlPlaneRef:
        name: codercontrolplane-sample
      key:
        name: {64 x a}
      """
    Then the API server accepts it

  @R-CRD-8 @D-4 @core
  Scenario: A negative replica count is rejected
    When a provisioner is submitted with spec:
      """
      controlPlaneRef:
        name: codercontrolplane-sample
      replicas: -1
      """
    Then the API server rejects it with a message mentioning:
      | spec.replicas              |
      | greater than or equal to 0 |
