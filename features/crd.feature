@crd
Feature: The CoderProvisioner CRD and what the API server admits
  The CRDs are installed and the API server itself refuses a malformed CoderProvisioner,
  with a message the user understands, before any operator sees it. Submissions here are
  dry runs: admission runs, nothing is stored.

  @R-CRD-1 @R-CRD-2 @core
  Scenario: The CRDs are Established
    # checks: R-CRD-1, R-CRD-2
    Then the CRD "coderprovisioners.coder.com" is Established
    # checks: none
    And the CRD "codercontrolplanes.coder.com" is Established

  @R-CRD-3 @extended
  Scenario: kubectl shows the phase, the ready replicas and the age
    Then `kubectl get coderprovisioner` shows, among its columns:
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

  # R-CRD-7's limit is 128; D-4 lowers it to coderd's 64 (R-CRD-13).
  @R-CRD-13 @D-4 @core
  Scenario: A key name of 65 characters is rejected
    When a provisioner is submitted with a spec of:
      """
      controlPlaneRef:
        name: codercontrolplane-sample
      key:
        name: {65 x a}
      """
    # checks: R-CRD-13, D-4
    Then the API server rejects it with a message mentioning:
      | spec.key.name |
      | 64            |

  # coderd takes any case (it stores names lower-cased, R-KEY-21), digits, '.', '_' and '-'.
  @R-CRD-7 @D-4 @core
  Scenario Outline: A key name coderd accepts is accepted: <shape>
    When a provisioner is submitted with a spec of:
      """
      controlPlaneRef:
        name: codercontrolplane-sample
      key:
        name: <name>
      """
    # checks: R-CRD-7, D-4
    Then the API server accepts it

    Examples:
      | shape                          | name           |
      | 64 characters                  | {64 x a}       |
      | upper case                     | Upper-Case-Key |
      | a digit first, '.' and '_'     | 0.key_name-1   |

  # R-CRD-8 sets no minimum; D-4 does.
  @D-4 @core
  Scenario: A negative replica count is rejected
    When a provisioner is submitted with spec:
      """
      controlPlaneRef:
        name: codercontrolplane-sample
      replicas: -1
      """
    # checks: D-4
    Then the API server rejects it with a message mentioning:
      | spec.replicas              |
      | greater than or equal to 0 |

  @R-CRD-4 @R-CRD-5 @R-CRD-6 @R-CRD-8 @R-CRD-9 @R-CRD-10 @R-CRD-11 @D-4 @extended
  Scenario: The spec declares its optional fields with their types and limits, and no credential field
    # checks: R-CRD-4, R-CRD-5, R-CRD-6, R-CRD-8, R-CRD-9, R-CRD-10, D-4
    Then the CRD "coderprovisioners.coder.com" declares these spec fields:
      | field                         | type    | maxLength | rule     |
      | controlPlaneRef.name          | string  |           | R-CRD-4  |
      | organizationName              | string  | 128       | R-CRD-5  |
      | key.name                      | string  | 64        | D-4      |
      | key.secretName                | string  | 253       | R-CRD-6  |
      | key.secretKey                 | string  | 253       | R-CRD-6  |
      | replicas                      | integer |           | R-CRD-8  |
      | tags                          | object  |           | R-CRD-9  |
      | image                         | string  |           | R-CRD-10 |
      | extraArgs                     | array   |           | R-CRD-10 |
      | extraEnv                      | array   |           | R-CRD-10 |
      | resources                     | object  |           | R-CRD-10 |
      | imagePullSecrets              | array   |           | R-CRD-10 |
      | terminationGracePeriodSeconds | integer |           | R-CRD-10 |
    # checks: R-CRD-11
    And the CRD "coderprovisioners.coder.com" declares no spec field "bootstrap"

  @R-CRD-12 @extended
  Scenario: The status declares exactly the contract's fields
    Then the CRD "coderprovisioners.coder.com" declares exactly these status fields:
      | field               | type    |
      | observedGeneration  | integer |
      | readyReplicas       | integer |
      | phase               | string  |
      | conditions          | array   |
      | organizationID      | string  |
      | organizationName    | string  |
      | provisionerKeyID    | string  |
      | provisionerKeyName  | string  |
      | tagsHash            | string  |
      | controlPlaneRefName | string  |
      | controlPlaneURL     | string  |
      | secretRef           | object  |

  @R-CRD-7 @core
  Scenario Outline: A spec.<field> longer than <limit> characters is rejected
    When a provisioner is submitted with a spec of:
      """
      controlPlaneRef:
        name: codercontrolplane-sample
      <yaml>
      """
    Then the API server rejects it with a message mentioning:
      | spec.<field> |
      | <limit>      |

    Examples:
      | field            | limit | yaml                            |
      | organizationName | 128   | organizationName: {129 x o}     |
      | key.secretName   | 253   | key: {secretName: {254 x s}}    |
      | key.secretKey    | 253   | key: {secretKey: {254 x k}}     |

  @R-CRD-14 @extended
  Scenario Outline: A <field> the API server could not store is rejected at admission: <value>
    When a provisioner is submitted with a spec of:
      """
      controlPlaneRef:
        name: codercontrolplane-sample
      key: {<field>: "<value>"}
      """
    Then the API server rejects it with a message mentioning:
      | spec.key.<field> |

    Examples:
      | field      | value              |
      | secretName | Not_A_Secret_Name  |
      | secretName | -leading-dash      |
      | secretName | trailing-dot.      |
      | secretKey  | has space          |
      | secretKey  | a/b                |
