@fake-coderd
Feature: No secret leaves its Secret
  The session token, the provisioner key plaintexts and the credential values live only in
  Secrets. After every scenario the suite searches the operator's log, the namespace's Events
  and the provisioner's status and annotations for every secret value the scenario knows, and
  fails the scenario when it finds one. This scenario walks the paths most likely to print one:
  credentials, a key rotation, a rate-limited request and the clean-up.

  @R-SEC-14 @operator-log @core
  Scenario: The token, the keys and the credential values appear in no log line, Event or status
    Given a Ready control plane with operator access
    And a credential Secret "proxy-credentials" with metadata:
      """
      labels: {coder.com/credential: "true"}
      annotations: {coder.com/credential-destinations: "{origin}"}
      """
    And the sample provisioner is applied with spec:
      """
      extraEnv:
        - name: PROXY_PASSWORD
          valueFrom:
            secretKeyRef: {name: proxy-credentials, key: value}
      """
    Then the provisioner becomes Ready
    And the Secret "{provisioner}-provisioner-key" holds a provisioner key
    When coderd answers every POST on "provisionerkeys" with status 429
    And the provisioner key Secret is deleted
    Then the provisioner has condition "ProvisionerKeyReady" "False" with reason "RateLimited"
    When coderd answers normally again
    Then the Secret "{provisioner}-provisioner-key" gets a new provisioner key
    And no secret of this scenario appears in the operator's log, the Events or the provisioner
    When the provisioner is deleted
    Then the provisioner is gone
    And no secret of this scenario appears in the operator's log, the Events or the provisioner
