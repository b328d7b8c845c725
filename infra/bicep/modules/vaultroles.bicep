// Key Vault Secrets User for the identities that read the deployment's secrets.

param vaultName string
param principalIds array

resource vault 'Microsoft.KeyVault/vaults@2023-07-01' existing = {
  name: vaultName
}

resource readers 'Microsoft.Authorization/roleAssignments@2022-04-01' = [for principal in principalIds: {
  name: guid(vault.id, principal, 'secrets-user')
  scope: vault
  properties: {
    principalId: principal
    principalType: 'ServicePrincipal'
    roleDefinitionId: subscriptionResourceId('Microsoft.Authorization/roleDefinitions', '4633458b-17de-408a-b874-0445c86b69e6')
  }
}]
