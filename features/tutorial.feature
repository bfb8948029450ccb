@tutorial
Feature: Deploy an External Provisioner, as the tutorial tells it
  The tutorial's kubectl commands run verbatim with a real kubectl and the admin kubeconfig,
  and their output is compared with the tutorial's "Expected output". The one substitution:
  the sample's GitHub URL is mapped to config/samples/coder_v1alpha1_coderprovisioner.yaml
  of this repository. The tutorial uses the namespace "coder", which no other scenario uses.

  @R-PRE-11 @R-ENT-1 @R-KEY-3 @R-RES-1 @R-RES-3 @R-ST-2 @R-ST-6 @R-CRED-2 @R-DEL-2 @core
  Scenario: The tutorial from its prerequisites to its clean-up
    Given the tutorial's namespace "coder" with a Ready control plane with operator access

    # Prerequisites
    When I run:
      """
      kubectl get codercontrolplane codercontrolplane-sample -n coder \
        -o jsonpath='{.status.phase}{"\n"}{.status.operatorAccessReady}{"\n"}'
      """
    # checks: none
    Then the output is:
      """
      Ready
      true
      """

    # 1. Check the license entitlement
    When I run:
      """
      kubectl get codercontrolplane codercontrolplane-sample -n coder \
        -o jsonpath='{.status.externalProvisionerDaemonsEntitlement}{"\n"}'
      """
    # checks: none
    Then the output is:
      """
      entitled
      """

    # 2. Deploy the provisioner
    When I run:
      """
      kubectl apply -f "https://raw.githubusercontent.com/coder/coder-k8s/main/config/samples/coder_v1alpha1_coderprovisioner.yaml"
      """
    # checks: none
    Then the output is:
      """
      coderprovisioner.coder.com/coderprovisioner-sample created
      """

    # 3. Verify
    When I run:
      """
      kubectl get coderprovisioner coderprovisioner-sample -n coder \
        -o jsonpath='{.status.phase}{"\n"}{range .status.conditions[*]}{.type}={.status} {.reason}{"\n"}{end}'
      """
    # checks: R-PRE-11, R-ENT-1, R-ST-2, R-ST-6, R-CRED-2
    Then running it again eventually prints "Ready" first and includes the lines:
      | line                                         | rules             |
      | ControlPlaneReady=True ControlPlaneAvailable | R-PRE-11, R-ST-6  |
      | OperatorAccessReady=True OperatorAccessReady | R-PRE-11, R-ST-6  |
      | ExternalProvisionersEntitled=True Entitled   | R-ENT-1, R-ST-6   |
      | CredentialsReady=True                        | R-CRED-2, R-ST-6  |
      | DeploymentReady=True                         | R-ST-6            |
    # checks: R-RES-1, R-RES-3
    And these objects exist, controlled by the provisioner:
      | kind           | name                                    |
      | Deployment     | provisioner-coderprovisioner-sample     |
      | ServiceAccount | coderprovisioner-sample-provisioner     |
      | Role           | provisioner-coderprovisioner-sample     |
      | RoleBinding    | provisioner-coderprovisioner-sample     |
      | Secret         | coderprovisioner-sample-provisioner-key |
    When I run:
      """
      kubectl get deployment,role,rolebinding provisioner-coderprovisioner-sample -n coder
      """
    # checks: R-RES-1
    Then the command succeeds and its output mentions:
      | deployment.apps/provisioner-coderprovisioner-sample                       |
      | role.rbac.authorization.k8s.io/provisioner-coderprovisioner-sample        |
      | rolebinding.rbac.authorization.k8s.io/provisioner-coderprovisioner-sample |
    When I run:
      """
      kubectl get sa coderprovisioner-sample-provisioner -n coder
      """
    # checks: R-RES-1
    Then the command succeeds and its output mentions:
      | coderprovisioner-sample-provisioner |
    When I run:
      """
      kubectl get secret coderprovisioner-sample-provisioner-key -n coder
      """
    # checks: R-RES-1
    Then the command succeeds and its output mentions:
      | coderprovisioner-sample-provisioner-key |
    # checks: R-KEY-3
    And the provisioner status records its provisioner key

    # 4. Clean up
    When I run:
      """
      kubectl delete coderprovisioner coderprovisioner-sample -n coder
      """
    # checks: none
    Then the command succeeds and its output mentions:
      | coderprovisioner.coder.com "coderprovisioner-sample" deleted |
    # checks: R-DEL-2
    And the provisioner is gone
    # checks: R-DEL-2
    And the recorded provisioner key no longer exists in coderd
